"""Views of a search result: the ranked table, the time/memory Pareto front, a short explanation of the winner
(where its time goes, what limits it, why each runner-up loses), search counts, and the JSON document."""

from __future__ import annotations

from io import StringIO

from meshplan.cost.memory import GiB
from meshplan.cost.result import INSIDE_COMPUTE
from meshplan.search.result import RankedPlan, SearchResult

COMM = ("tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm")
"""Exposed communication components of the time breakdown."""


def layout(rp: RankedPlan) -> str:
    """Degrees in one short string, e.g. ``tp8+sp cp2 pp8x3 dp16 z1``."""
    p = rp.plan
    parts = [f"tp{p.tp}{'+sp' if p.sp else ''}"]
    if p.cp > 1:
        parts.append(f"cp{p.cp}{'(a2a)' if p.cp_kind == 'a2a' else ''}")
    parts.append(f"pp{p.pp}" + (f"x{p.vpp}" if p.vpp > 1 else ""))
    parts.append(f"dp{p.dp}")
    if p.ep > 1:
        parts.append(f"ep{p.ep}" + (f"/etp{p.etp}" if p.etp > 1 else ""))
    parts.append(f"z{p.zero}" + (f"/{p.dp_shard}" if p.dp_shard else ""))
    if p.batch_shares:
        parts.append("shares " + ":".join(str(s) for s in p.batch_shares))
    return " ".join(parts)


def recompute_text(rp: RankedPlan) -> str:
    """Recompute mode, with the layers per rank for partial full recompute."""
    p = rp.plan
    if p.recompute == "full" and p.recompute_layers:
        return f"full:{p.recompute_layers}"
    return p.recompute


def exposed_comm(rp: RankedPlan) -> float:
    """Exposed communication on the critical path (s)."""
    t = rp.best.time
    return sum(getattr(t, k) for k in COMM)


def plan_row(rp: RankedPlan) -> dict:
    """JSON view of one ranked plan."""
    e = rp.best
    return {"plan": rp.plan.to_dict(), "layout": layout(rp), "gpus": rp.cluster.describe(),
            "schedule": rp.plan.schedule_name if rp.plan.pp > 1 else "", "micro_batch": rp.plan.micro_batch,
            "recompute": recompute_text(rp), "step_time_s": e.step_time, "tokens_per_s": e.tokens_per_s,
            "mfu": e.mfu, "peak_memory_bytes": e.peak_memory, "capacity_bytes": e.capacity,
            "bubble_fraction": e.bubble_fraction, "exposed_comm_s": exposed_comm(rp),
            "closed_form_step_time_s": rp.estimate.step_time,
            "pipeline_source": e.pipeline_source, "tokens_per_dollar": rp.tokens_per_dollar,
            "time_s": e.time.as_dict(), "memory_bytes": e.memory.as_dict()}


def result_json(result: SearchResult) -> dict:
    """The ``--json`` document."""
    out = {"plans": [plan_row(rp) for rp in result.plans], "considered": result.considered,
           "pruned": dict(sorted(result.pruned.items())), "evaluated": result.evaluated,
           "search_time_s": result.search_time_s, "pareto": [plan_row(rp) for rp in result.pareto]}
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
        bits.append(f"memory: peak {e.peak_memory / GiB:.1f} GiB of a {limit_fraction * e.capacity / GiB:.1f} GiB "
                    f"limit" + (f", which forces {recompute_text(rp)} recompute"
                                if rp.plan.recompute != "none" else ""))
    if e.bubble_fraction > 0.05:
        bits.append(f"pipeline bubble {100 * e.bubble_fraction:.0f} %")
    comm = exposed_comm(rp)
    if comm > 0.05 * e.step_time:
        bits.append(f"exposed communication {comm:.2f} s")
    return "; ".join(bits) or "compute-bound (little bubble, communication hidden, memory to spare)"


def why_loses(win: RankedPlan, other: RankedPlan) -> str:
    """The components in which a runner-up is slower than the winner."""
    a, b = win.best.time.as_dict(), other.best.time.as_dict()
    a.pop("recompute")
    b.pop("recompute")
    diffs = sorted(((b[k] - a[k], k) for k in a), reverse=True)
    worse = [f"{k.replace('_', ' ')} +{d:.2f} s" for d, k in diffs if d > 0.005 * win.step_time][:2]
    return f"{other.step_time - win.step_time:+.2f} s: " + (", ".join(worse) or "small differences everywhere")


def _table(result: SearchResult):
    from rich.table import Table

    cost = result.request.objective == "cost" or any(rp.dollars_per_hour for rp in result.plans)
    t = Table(title="best plans", show_header=True)
    for col in ("#", "layout", "schedule", "mb", "recompute", "step s", "tokens/s", "MFU %", "peak GiB",
                "bubble %", "comm s"):
        t.add_column(col, justify="right" if col not in ("layout", "schedule", "recompute") else "left")
    if cost:
        t.add_column("tokens/$", justify="right")
    mixed = not result.cluster.homogeneous
    if mixed:
        t.add_column("GPUs (stage order)")
    for i, rp in enumerate(result.plans, 1):
        e = rp.best
        row = [str(i), layout(rp), rp.plan.schedule_name if rp.plan.pp > 1 else "-", str(rp.plan.micro_batch),
               recompute_text(rp), f"{e.step_time:.3f}", f"{e.tokens_per_s:,.0f}", f"{100 * e.mfu:.1f}",
               f"{e.peak_memory / GiB:.1f}", f"{100 * e.bubble_fraction:.1f}", f"{exposed_comm(rp):.3f}"]
        if cost:
            row.append(f"{rp.tokens_per_dollar:,.0f}")
        if mixed:
            row.append(rp.cluster.describe())
        t.add_row(*row)
    return t


def render_text(result: SearchResult) -> str:
    """Readable report: table, Pareto front, explanation, search counts (or the nothing-fits message)."""
    from rich.console import Console

    buf = StringIO()
    con = Console(file=buf, width=140, force_terminal=False)
    req = result.request
    con.print(f"{result.model.name} on {result.cluster.describe()}: batch {req.global_batch} x {req.seq_len} "
              f"tokens, {req.precision}, memory limit {100 * req.max_memory_fraction:.0f} % of each GPU")
    if result.infeasible is not None:
        con.print(f"NOTHING FITS: {result.infeasible.reason}")
    else:
        con.print(_table(result))
        win = result.plans[0]
        con.print(f"winner: {layout(win)}, {win.plan.schedule_name if win.plan.pp > 1 else 'no pipeline'}, "
                  f"micro-batch {win.plan.micro_batch}, recompute {recompute_text(win)}")
        con.print(f"  time goes to: {where_time_goes(win)}")
        con.print(f"  limited by: {what_limits(win, req.max_memory_fraction)}")
        for i, rp in enumerate(result.plans[1:], 2):
            con.print(f"  #{i} loses {why_loses(win, rp)}")
        con.print("time/memory Pareto front: " + "; ".join(
            f"{rp.estimate.step_time:.2f} s @ {rp.estimate.peak_memory / GiB:.1f} GiB ({layout(rp)})"
            for rp in result.pareto[:6]))
    pruned = ", ".join(f"{k} {v}" for k, v in sorted(result.pruned.items(), key=lambda kv: -kv[1]))
    con.print(f"searched {result.considered} candidates in {result.search_time_s:.2f} s: "
              f"{result.evaluated} full estimates; pruned: {pruned}")
    return buf.getvalue()
