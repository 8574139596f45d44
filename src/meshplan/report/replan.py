"""The re-planning preview: the change, the current layout's fate, each priced switch, the decision, and what
the rank map saved against the default order."""

from __future__ import annotations

from io import StringIO

from meshplan.report.layout import layout_short
from meshplan.search.replan import ReplanResult, SwitchOption

GiB = 2**30


def _layout(plan, limit: int = 34) -> str:
    text = layout_short(plan)
    return text if len(text) <= limit else text[:limit - 13].rstrip() + " split uneven"


def _change(result: ReplanResult, cluster) -> str:
    ch = result.change
    what = [f"{len(ch.lost)} GPUs lost"] if ch.lost else []
    what += [f"{ch.added} added"] if ch.added else []
    what += [f"GPU {g} at {f:.0%}" for g, f in ch.slow.gpus]
    what += [f"node {d}'s links at {f:.0%}" for d, f in ch.slow.links]
    return f"{cluster.describe()} -> {result.new_cluster.describe()}" + (f" ({', '.join(what)})" if what else "")


def option_row(i: int, opt: SwitchOption) -> dict:
    """JSON view of one priced switch."""
    x, t, m = opt.bytes, opt.time, opt.rank_map
    inflow = x.in_local + x.in_fabric
    return {"option": i + 1, "plan": opt.ranked.plan.to_dict(), "layout": layout_short(opt.ranked.plan),
            "gpus": opt.ranked.cluster.describe(), "step_time_s": opt.ranked.step_time,
            "switch_s": t.total_s, "switch_bound_s": t.bound_s, "transfer_s": t.transfer_s, "rebuild_s": t.rebuild_s,
            "storage_read_s": t.storage_s, "checkpoint_route_s": t.checkpoint_s, "horizon_s": opt.horizon_s,
            "max_in_bytes": float(inflow.max()), "max_in_local_bytes": float(x.in_local.max()),
            "max_in_fabric_bytes": float(x.in_fabric.max()),
            "max_out_bytes": float((x.out_local + x.out_fabric).max()), "moved_bytes": x.moved,
            "lost_bytes": float(x.lost.sum()), "recovered_bytes": opt.recovered, "moved_by_kind_bytes": dict(x.by_kind),
            "messages_max": t.messages, "chunks": t.chunks, "staging_bytes": t.staging,
            "peak_bytes": t.peak_bytes, "to_move_bytes": opt.to_move, "to_move_default_bytes": opt.to_move_default,
            "rank_map": {"slot_order": list(m.slot_order), "gpu_of_rank": m.phys.tolist()}}


def replan_json(result: ReplanResult, model, cluster) -> dict:
    """The ``--json`` document."""
    return {"model": model.name, "old_gpus": cluster.describe(), "new_gpus": result.new_cluster.describe(),
            "current": {"plan": result.current.to_dict(), "layout": layout_short(result.current),
                        "step_time_s": result.current_step, "cannot_run": result.current_reason},
            "slow_gpus": [list(x) for x in result.change.slow.gpus],
            "slow_links": [list(x) for x in result.change.slow.links],
            "options": [option_row(i, o) for i, o in enumerate(result.options)],
            "choice": None if result.choice is None else result.choice + 1, "reason": result.reason,
            "break_even_steps": result.break_even_steps, "search_time_s": result.search.search_time_s}


def _table(result: ReplanResult, width: int) -> str:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    buf = StringIO()
    con = Console(file=buf, width=width, force_terminal=False, no_color=True, highlight=False)
    tab = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1),
                caption="step, switch, remaining (switch + remaining steps): seconds; in: GiB received by the busiest "
                "rank; * = chosen", caption_justify="left")
    for head in ("#", "layout", "GPUs", "step", "switch", "in", "remaining"):
        tab.add_column(head, justify="left" if head in ("layout", "GPUs") else "right", no_wrap=True)
    for i, o in enumerate(result.options):
        x, t = o.bytes, o.time
        tab.add_row(f"{'*' if i == result.choice else ''}{i + 1}", _layout(o.ranked.plan, 30),
                    str(o.ranked.cluster.n_gpus), f"{o.ranked.step_time:.3f}", f"{t.total_s:.2f}",
                    f"{(x.in_local + x.in_fabric).max() / GiB:.2f}", f"{o.horizon_s:,.0f}")
    con.print(tab)
    return buf.getvalue()


def _details(opt: SwitchOption) -> list[str]:
    x, t, m = opt.bytes, opt.time, opt.rank_map
    lines = [f"  switch {t.total_s:.2f} s = transfer {t.transfer_s:.2f} s (bound {t.bound_s:.2f} s at rated "
             f"bandwidth; {t.chunks} chunk(s) of {t.staging / GiB:.1f} GiB, {t.messages} messages on the busiest "
             f"rank) + fixed and per-tensor work {t.overhead_s:.2f} s + communicators {t.rebuild_s:.2f} s"
             + (f" + storage reads {t.storage_s:.2f} s" if t.storage_s else ""),
             f"  busiest rank receives {x.in_local.max() / GiB:.2f} GiB over NVLink and {x.in_fabric.max() / GiB:.2f}"
             f" GiB over the NICs; peak {t.peak_bytes / GiB:.1f} GiB of state + staging per rank; through a "
             f"checkpoint instead: {t.checkpoint_s:.0f} s (save, restart, load)"]
    kinds = ", ".join(f"{k} {v / GiB:,.0f}" for k, v in x.by_kind.items() if v > 0)
    if kinds:
        lines.append(f"  moved over all ranks: {x.moved / GiB:,.0f} GiB ({kinds} GiB by state kind)")
    if opt.recovered > 0:
        lines.append(f"  {opt.recovered / GiB:,.1f} GiB of the lost GPUs' state comes from its peer copies "
                     "(state_copies): no checkpoint read, no step lost")
    if x.lost.sum() > 0:
        lines.append(f"  {x.lost.sum() / GiB:,.1f} GiB of state lived only on lost GPUs: read from the last "
                     "checkpoint (steps since it are lost)")
    saved = opt.to_move_default - opt.to_move
    if saved > 1e-3 * max(opt.to_move_default, 1.0):
        lines.append(f"  rank map: {saved / GiB:,.0f} GiB less to move than torchrun's order "
                     f"({opt.to_move_default / GiB:,.0f} -> {opt.to_move / GiB:,.0f} GiB; slots "
                     f"{'-'.join(map(str, m.slot_order))} in each scale-up domain, domains aligned to the old layout)")
    else:
        lines.append("  rank map: torchrun's order already keeps the most state in place")
    return lines


def render_replan(result: ReplanResult, model, cluster, *, width: int = 100) -> str:
    """The preview as text."""
    req = result.search.request
    out = [f"{model.name}: {_change(result, cluster)}, batch {req.global_batch} x {req.seq_len} tokens"]
    cur = f"current: {_layout(result.current, 60)}"
    out.append(cur + (f", {result.current_step:.3f} s per step" if result.current_step is not None
                      else f": cannot run, {result.current_reason}"))
    if not result.options:
        out.append(f"decision: {result.reason}")
        if result.search.infeasible is not None:
            out.append(f"  {result.search.infeasible.reason}")
        return "\n".join(out) + "\n"
    out.append(_table(result, width).rstrip())
    pick = result.choice if result.choice is not None else 0
    out += [f"#{pick + 1}:"] + _details(result.options[pick])
    verdict = f"switch to #{result.choice + 1}" if result.choice is not None else "stay"
    out.append(f"decision: {verdict}: {result.reason}")
    if result.break_even_steps is not None:
        out.append(f"  break-even after {result.break_even_steps:,.0f} steps")
    return "\n".join(out) + "\n"
