"""Views of a plan-search result: the ranked table, the time/memory Pareto front, a short explanation of the winner
(where its time goes, what limits it, why each runner-up loses), search counts, and the JSON document. One time per
plan everywhere: the simulated estimate where the search simulated it (``RankedPlan.best``)."""

from __future__ import annotations

from io import StringIO

from meshplan.cost.result import INSIDE_COMPUTE
from meshplan.report.analysis import GIB, verdict
from meshplan.report.data import pareto_front
from meshplan.report.layout import layout_short, recompute_text
from meshplan.search.result import RankedPlan, SearchResult

COMM = ("tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm")
"""Exposed communication components of the time breakdown."""


def exposed_comm(rp: RankedPlan) -> float:
    """Exposed communication on the critical path (s)."""
    t = rp.best.time
    return sum(getattr(t, k) for k in COMM)


def front(result: SearchResult) -> list[RankedPlan]:
    """The fitting plans no other fitting plan beats on both step time and peak memory, fastest first, each timed
    as the table times it (the simulated estimate of a plan the search re-ranked)."""
    ranked = {(id(rp.cluster), rp.plan): rp for rp in result.plans}
    plans = [ranked.get((id(rp.cluster), rp.plan), rp) for rp in result.fitting]
    idx = pareto_front([(rp.step_time, rp.best.peak_memory) for rp in plans])
    return [plans[i] for i in idx]


def plan_row(rp: RankedPlan) -> dict:
    """JSON view of one ranked plan."""
    e = rp.best
    return {"plan": rp.plan.to_dict(), "layout": layout_short(rp.plan), "gpus": rp.cluster.describe(),
            "schedule": rp.plan.schedule_name if rp.plan.pp > 1 else "", "micro_batch": rp.plan.micro_batch,
            "recompute": recompute_text(rp.plan), "step_time_s": e.step_time, "tokens_per_s": e.tokens_per_s,
            "mfu": e.mfu, "peak_memory_bytes": e.peak_memory, "capacity_bytes": e.capacity,
            "bubble_fraction": e.bubble_fraction, "exposed_comm_s": exposed_comm(rp),
            "closed_form_step_time_s": rp.estimate.step_time,
            "pipeline_source": e.pipeline_source, "tokens_per_dollar": rp.tokens_per_dollar,
            "time_s": e.time.as_dict(), "memory_bytes": e.memory.as_dict()}


def result_json(result: SearchResult) -> dict:
    """The ``--json`` document."""
    out = {"plans": [plan_row(rp) for rp in result.plans], "considered": result.considered,
           "pruned": dict(sorted(result.pruned.items())), "evaluated": result.evaluated,
           "search_time_s": result.search_time_s, "pareto": [plan_row(rp) for rp in front(result)],
           "framework": result.request.framework.name}
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
        row = [str(i), layout_short(rp.plan), rp.plan.schedule_name if rp.plan.pp > 1 else "-",
               str(rp.plan.micro_batch), recompute_text(rp.plan), f"{e.step_time:.3f}", f"{e.tokens_per_s:,.0f}",
               f"{100 * e.mfu:.1f}", f"{e.peak_memory / GIB:.1f}", f"{100 * e.bubble_fraction:.1f}",
               f"{exposed_comm(rp):.3f}"]
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
              f"tokens, {req.precision}, {req.framework.name}, memory limit {100 * req.max_memory_fraction:.0f} % "
              "of each GPU")
    if result.infeasible is not None:
        con.print(f"NOTHING FITS: {result.infeasible.reason}")
    else:
        con.print(_table(result))
        win = result.plans[0]
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
