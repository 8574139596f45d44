"""Views of a plan-search result: the ranked table, the time/memory Pareto front, a short explanation of the winner
(where its time goes, what limits it, why each runner-up loses), search counts, and the JSON document. One time per
plan everywhere: the simulated estimate where the search simulated it (``RankedPlan.best``)."""

from __future__ import annotations

from io import StringIO

from meshplan.cost.bands import band_for
from meshplan.cost.result import INSIDE_COMPUTE
from meshplan.report.analysis import GIB, verdict
from meshplan.report.band import band_json, band_text
from meshplan.report.layout import layout_short, recompute_text
from meshplan.search.result import RankedPlan, SearchResult

COMM = ("tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm")
"""Exposed communication components of the time breakdown."""


def exposed_comm(rp: RankedPlan) -> float:
    """Exposed communication on the critical path (s)."""
    t = rp.best.time
    return sum(getattr(t, k) for k in COMM)


def front(result: SearchResult) -> list[RankedPlan]:
    """The time/memory Pareto front the search found (``meshplan.search.rank.pareto``), fastest first."""
    return list(result.front)


def plan_row(rp: RankedPlan, model=None) -> dict:
    """JSON view of one ranked plan (with its error band when the model is given)."""
    e = rp.best
    return {"plan": rp.plan.to_dict(), "layout": layout_short(rp.plan), "gpus": rp.cluster.describe(),
            "schedule": rp.plan.schedule_name if rp.plan.pp > 1 else "", "micro_batch": rp.plan.micro_batch,
            "recompute": recompute_text(rp.plan), "step_time_s": e.step_time, "tokens_per_s": e.tokens_per_s,
            "mfu": e.mfu, "peak_memory_bytes": e.peak_memory, "capacity_bytes": e.capacity,
            "bubble_fraction": e.bubble_fraction, "exposed_comm_s": exposed_comm(rp),
            "closed_form_step_time_s": rp.estimate.step_time,
            "pipeline_source": e.pipeline_source, "tokens_per_dollar": rp.tokens_per_dollar,
            "time_s": e.time.as_dict(), "memory_bytes": e.memory.as_dict(),
            **({"band": band_json(band_for(model, rp.cluster, rp.plan), e.step_time)} if model is not None else {})}


def result_json(result: SearchResult) -> dict:
    """The ``--json`` document."""
    out = {"plans": [plan_row(rp, result.model) for rp in result.plans], "considered": result.considered,
           "pruned": dict(sorted(result.pruned.items())), "evaluated": result.evaluated,
           "search_time_s": result.search_time_s, "pareto": [plan_row(rp, result.model) for rp in front(result)],
           "framework": result.request.framework.name,
           "memory_limit": {"fraction": result.request.max_memory_fraction, "why": result.request.memory_limit_why}}
    if result.infeasible is not None:
        inf = result.infeasible
        out["infeasible"] = {"kind": inf.kind, "reason": inf.reason, "details": inf.details}
    return out


def where_time_goes(rp: RankedPlan, n: int = 4) -> str:
    """The largest components of the winner's step."""
    t = rp.best.time.as_dict()
    inside = {k: t.pop(k) for k in INSIDE_COMPUTE}
    step = rp.step_time
    top = sorted(t.items(), key=lambda kv: -kv[1])[:n]
    text = ", ".join(f"{k.replace('_', ' ')} {v:.2f} s ({100 * v / step:.0f} %)" for k, v in top if v > 0)
    return text + "".join(f"; {k.replace('_', ' ')} {v:.2f} s inside compute" for k, v in inside.items() if v > 0)


def what_limits(rp: RankedPlan, limit_fraction: float) -> str:
    """The binding constraint: memory headroom, bubble, or communication."""
    e = rp.best
    head = limit_fraction * e.capacity - e.peak_memory
    bits = []
    if rp.plan.recompute != "none" or head < 0.05 * e.capacity:
        bits.append(f"memory: peak {e.peak_memory / GIB:.1f} GiB of a {limit_fraction * e.capacity / GIB:.1f} GiB "
                    f"limit" + (f", which forces {recompute_text(rp.plan)} recompute"
                                if rp.plan.recompute != "none" else ""))
    if e.bubble_fraction > 0.05:
        bits.append(f"pipeline bubble {100 * e.bubble_fraction:.0f} %")
    comm = exposed_comm(rp)
    if comm > 0.05 * e.step_time:
        bits.append(f"exposed communication {comm:.2f} s")
    return "; ".join(bits) or "compute-bound (little bubble, communication hidden, memory to spare)"


def runner_up(win: RankedPlan, other: RankedPlan, limit_fraction: float) -> str:
    """Why a runner-up ranks below the winner, in the report's words (``verdict``)."""
    c = verdict(win.best, other.best, limit=limit_fraction * other.best.capacity, label="")
    return f"{c.status}: {c.text}"


WIDE = 120
"""Columns from which the plan table shows every column; narrower terminals get the compact table."""


def _table(result: SearchResult, width: int):
    """The ranked plans: every column from WIDE columns up; below it a compact table (schedule and micro-batch
    inside the layout cell, no tokens/s, light borders) that fits 80 columns."""
    from rich import box
    from rich.table import Table

    wide = width >= WIDE
    cost = result.request.objective == "cost"
    mixed = not result.cluster.homogeneous
    t = Table(title="best plans", show_header=True, box=box.HEAVY_HEAD if wide else box.SIMPLE_HEAD,
              pad_edge=wide, padding=(0, 1) if wide else (0, 0, 0, 1), show_edge=wide)
    cols = (["#", "layout", "schedule", "mb", "recompute", "step s", "band %", "tokens/s", "MFU %", "peak GiB",
             "bubble %", "comm s"] if wide else ["#", "layout", "recompute", "step s", "MFU %", "GiB"] +
            ([] if cost else ["bubble %"]) + ["comm s"])
    cols += (["tokens/$"] if cost else []) + (["GPUs (stage order)"] if mixed and wide else [])
    for col in cols:
        text = col in ("layout", "schedule", "GPUs (stage order)")
        t.add_column(col, justify="left" if text or col == "recompute" else "right", overflow="fold",
                     no_wrap=not text, min_width=20 if col == "layout" and not wide else None,
                     max_width=24 if col == "layout" and not wide else None)
    for i, rp in enumerate(result.plans, 1):
        e, p = rp.best, rp.plan
        sched = p.schedule_name if p.pp > 1 else "-"
        on = f" on {rp.cluster.describe()}" if mixed else ""
        head = [str(i), layout_short(p), sched, str(p.micro_batch)] if wide else \
            [str(i), f"{layout_short(p)}{f' {sched}' if p.pp > 1 else ''} mb{p.micro_batch}{on}"]
        row = head + [recompute_text(p), f"{e.step_time:.3f}"] + \
            ([_band_cell(result.model, rp), f"{e.tokens_per_s:,.0f}"] if wide else []) + \
            [f"{100 * e.mfu:.1f}", f"{e.peak_memory / GIB:.1f}"] + \
            ([f"{100 * e.bubble_fraction:.1f}"] if wide or not cost else []) + [f"{exposed_comm(rp):.3f}"]
        row += ([f"{rp.tokens_per_dollar:,.0f}" if wide else f"{rp.tokens_per_dollar / 1e6:.2f}M"] if cost else [])
        row += [rp.cluster.describe()] if mixed and wide else []
        t.add_row(*row)
    return t


def _band_cell(model, rp: RankedPlan) -> str:
    """``-4/+3`` (% of measured time against predicted, 80 % band), ``!`` where no validated run covers it."""
    b = band_for(model, rp.cluster, rp.plan)
    if b is None:
        return "-"
    fast, slow = b.interval(rp.step_time)
    return f"{100 * (fast / rp.step_time - 1):+.0f}/{100 * (slow / rp.step_time - 1):+.0f}{'' if b.covered else '!'}"


def band_lines(result: SearchResult) -> list[str]:
    """Below the table: the winner's band, the bands of the others (compact tables have no column), and the
    flag of any plan no validated run covers."""
    out = []
    for i, rp in enumerate(result.plans, 1):
        b = band_for(result.model, rp.cluster, rp.plan)
        if b is None:
            return []
        if i == 1 or not b.covered:
            out.append(f"#{i} 80 % band: {band_text(b, rp.step_time)}")
    return out


def idle_pools(cluster, used) -> str:
    """The pools of ``cluster`` a plan on ``used`` leaves idle, e.g. ``32xa100-80gb``; empty when none."""
    have = {p.gpu.name: p.n_gpus for p in used.pools}
    return " + ".join(f"{p.n_gpus - have.get(p.gpu.name, 0)}x{p.gpu.name}" for p in cluster.pools
                      if p.n_gpus > have.get(p.gpu.name, 0))


def request_notes(result: SearchResult) -> list[str]:
    """What the user should know about the request itself: a sequence beyond the model's trained positions, a
    memory limit above the device, fewer plans than asked for, and which peak the MFU divides by."""
    req, model, out = result.request, result.model, []
    if model.max_seq_len and req.seq_len > model.max_seq_len:
        out.append(f"seq_len {req.seq_len} exceeds {model.name}'s {model.max_seq_len} trained positions; the "
                   "prediction times the layout, not the model's quality at that length")
    if req.max_memory_fraction > 1:
        out.append(f"memory limit {100 * req.max_memory_fraction:.0f} % is above the device's memory: plans "
                   "over 100 % will not run")
    if req.precision == "fp8":
        out.append(f"MFU divides {mfu_peak(req.precision)}")
    if result.plans and len(result.plans) < req.top:
        out.append(f"{len(result.plans)} of the --top {req.top} plans shown: only {len(result.fitting)} distinct "
                   "plans fit and survived the bounds")
    return out


def mfu_peak(precision: str) -> str:
    """Which peak the model-FLOPs utilisation divides by (``cost.estimate``: fp8 runs against the bf16 dense
    peak, as NVIDIA's and torchtitan's published MFU do)."""
    return "by the bf16 dense peak (fp8 GEMMs counted as bf16 FLOPs)" if precision == "fp8" else \
        f"by the {precision} dense peak"


def render_text(result: SearchResult, width: int = 80) -> str:
    """Readable report in ``width`` columns: table, Pareto front, explanation, search counts (or the
    nothing-fits message)."""
    from rich.console import Console

    buf = StringIO()
    con = Console(file=buf, width=width, force_terminal=False, no_color=True, highlight=False)
    req = result.request
    con.print(f"{result.model.name} on {result.cluster.describe()}: batch {req.global_batch} x {req.seq_len} "
              f"tokens, {req.precision}, {req.framework.name}, memory limit {100 * req.max_memory_fraction:.0f} % "
              f"of each GPU ({req.memory_limit_why})")
    for note in request_notes(result):
        con.print(f"note: {note}")
    if result.infeasible is not None:
        con.print(f"NOTHING FITS: {result.infeasible.reason}")
    else:
        con.print(_table(result, width))
        for line in band_lines(result):
            con.print(line)
        win = result.plans[0]
        idle = idle_pools(result.cluster, win.cluster)
        if idle:
            con.print(f"note: the winner leaves {idle} idle (pools may idle in a mixed cluster; a plan on every "
                      "pool is in the table only if it is among the best)")
        con.print(f"winner: {layout_short(win.plan)}, "
                  f"{win.plan.schedule_name if win.plan.pp > 1 else 'no pipeline'}, micro-batch "
                  f"{win.plan.micro_batch}, recompute {recompute_text(win.plan)}")
        con.print(f"  time goes to: {where_time_goes(win)}")
        con.print(f"  limited by: {what_limits(win, req.max_memory_fraction)}")
        for i, rp in enumerate(result.plans[1:], 2):
            con.print(f"  #{i} {runner_up(win, rp, req.max_memory_fraction)}")
        con.print("time/memory Pareto front: " + "; ".join(
            f"{rp.step_time:.2f} s @ {rp.best.peak_memory / GIB:.1f} GiB ({layout_short(rp.plan)})"
            for rp in front(result)[:6]))
    pruned = ", ".join(f"{k} {v}" for k, v in sorted(result.pruned.items(), key=lambda kv: -kv[1]))
    con.print(f"searched {result.considered} candidates in {result.search_time_s:.2f} s: "
              f"{result.evaluated} full estimates; pruned: {pruned}")
    return buf.getvalue()
