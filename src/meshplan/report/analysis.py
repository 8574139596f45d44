"""Readable findings shared by the HTML and text reports: the layout in one line, where the time goes, what
limits the plan, and why each alternative loses. Pure functions of the Report's numbers."""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.cost.result import Estimate
from meshplan.report.data import Report
from meshplan.spec.schedules import schedule_spec

GIB = 2**30
SAME_TIME = 0.005
"""Step times within 0.5 % count as equal (below the cost model's resolution)."""
SAME_MEMORY = 0.05 * GIB
"""Peak memories within 0.05 GiB count as equal."""
COMPONENT_NAMES = {"compute": "compute", "recompute": "recompute (inside compute)",
                   "host_wait": "waiting on the host (inside compute)", "bubble": "pipeline bubble",
                   "tp_comm": "TP communication", "cp_comm": "CP communication and merges", "ep_comm": "EP all-to-all",
                   "pp_comm": "pipeline sends", "dp_comm": "DP/ZeRO communication", "optimizer": "optimizer step",
                   "overhead": "fixed overhead"}
"""Readable name of each TimeBreakdown field."""
HOST_HINT = 0.05
"""Host-wait share of the step above which the report names it."""
BUBBLE_HINT = 0.05
"""Bubble share of the step above which the report suggests how to shrink it."""


def gib(x: float) -> str:
    """Bytes as GiB with one decimal."""
    return f"{x / GIB:.1f}"


def headline(est: Estimate) -> list[tuple[str, str]]:
    """(name, value) rows of the predicted figures."""
    fit = "" if est.fits else "  (DOES NOT FIT)"
    return [("step time", f"{est.step_time:.3f} s"), ("tokens/s", f"{est.tokens_per_s:,.0f}"),
            ("MFU", f"{100 * est.mfu:.1f} %"),
            ("peak memory / GPU", f"{gib(est.peak_memory)} GiB of {gib(est.capacity)} GiB{fit}"),
            ("pipeline bubble", f"{100 * est.bubble_fraction:.1f} % of the step"),
            ("pipeline model", est.pipeline_source)]


def time_shares(est: Estimate) -> list[tuple[str, float, float]]:
    """(component, seconds, share of the step) of every non-zero component, largest first.

    ``recompute`` is listed although it is already inside ``compute`` (its share says how much of it).
    """
    step = est.step_time or 1.0
    rows = [(k, v, v / step) for k, v in est.time.as_dict().items() if v > 0]
    return sorted(rows, key=lambda r: -r[1])


def component_name(field: str) -> str:
    """Readable name of a TimeBreakdown field."""
    return COMPONENT_NAMES.get(field, field.replace("_", " "))


def largest_exposed(est: Estimate) -> tuple[str, float] | None:
    """The largest component on the critical path that is not useful compute (None if there is none)."""
    rows = [(k, v) for k, v, _ in time_shares(est) if k not in ("compute", "recompute")]
    return rows[0] if rows else None


def limiters(rep: Report) -> list[str]:
    """Sentences on what limits the plan: exposed overhead, bubble, stage balance, recompute, memory."""
    est, step = rep.estimate, rep.estimate.step_time
    out = [f"compute is {100 * est.time.compute / step:.1f} % of the step (MFU {100 * est.mfu:.1f} %)"]
    top = largest_exposed(est)
    if top:
        out.append(f"largest exposed overhead: {component_name(top[0])} {top[1]:.3f} s "
                   f"({100 * top[1] / step:.1f} % of the step)")
    if rep.plan.pp > 1:
        out.append(_bubble_sentence(rep))
        imb = _imbalance_sentence(rep)
        if imb:
            out.append(imb)
    if est.time.host_wait > HOST_HINT * step:
        out.append(f"the device waits {est.time.host_wait:.3f} s ({100 * est.time.host_wait / step:.1f} % of the "
                   "step) for the host to issue kernels: larger micro-batches, fewer local experts or CUDA graphs "
                   "would hide it")
    if est.time.recompute > 0:
        out.append(f"recompute ({rep.plan.recompute}) costs {est.time.recompute:.3f} s "
                   f"({100 * est.time.recompute / step:.1f} % of the step)")
    out.append(memory_sentence(rep))
    return out


def _bubble_sentence(rep: Report) -> str:
    plan, est = rep.plan, rep.estimate
    text = (f"pipeline bubble: {est.time.bubble:.3f} s ({100 * est.bubble_fraction:.1f} % of the step) with "
            f"{plan.n_micro} micro-batches over {plan.pp} stages ({plan.schedule_name})")
    if est.bubble_fraction > BUBBLE_HINT:
        other = ("" if schedule_spec(plan.schedule_name).zero_bubble else " or a zero-bubble schedule (zb_h1, zbv)"
                 if plan.vpp > 1 else " or an interleaved / zero-bubble schedule")
        text += f"; more micro-batches per step{other} would shrink it"
    return text


def _imbalance_sentence(rep: Report) -> str:
    """Stage imbalance from the simulated busy time per rank, if above 5 %."""
    busy = rep.timeline.busy
    lo, hi = min(busy), max(busy)
    if lo <= 0 or hi / lo - 1 <= 0.05:
        return ""
    worst = busy.index(hi)
    return (f"stage imbalance: rank {worst} is busy {100 * (hi / lo - 1):.1f} % longer than the least busy rank "
            f"({hi:.3f} s vs {lo:.3f} s)")


def memory_sentence(rep: Report) -> str:
    """Headroom (or shortfall) of the fullest GPU against the limit, naming its largest component."""
    est, limit = rep.estimate, rep.limit
    per = est.memory_per_stage or (est.memory,)
    rank = max(range(len(per)), key=lambda r: per[r].total())
    comp, size = max(per[rank].as_dict().items(), key=lambda kv: kv[1])
    what = "the planner's limit" if rep.memory_limit is not None else "device memory"
    peak = est.peak_memory
    where = f"rank {rank}, largest part {comp} {gib(size)} GiB"
    if peak > limit:
        return (f"DOES NOT FIT: needs {gib(peak)} GiB, {gib(peak - limit)} GiB over {what} of {gib(limit)} GiB "
                f"({where})")
    return f"memory headroom: {gib(limit - peak)} GiB free of {gib(limit)} GiB {what} ({where})"


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """How an alternative compares with the reported plan."""

    label: str
    """The alternative's label."""
    status: str
    """``loses``, ``trade-off``, ``better``, ``same`` or ``does not fit``."""
    time_delta: float
    """Relative step time difference (alternative / plan - 1)."""
    memory_delta: float
    """Peak memory difference (bytes, alternative - plan)."""
    text: str
    """One readable sentence."""


def compare(rep: Report, index: int) -> Comparison:
    """Why alternative ``index`` loses to the reported plan (or that it does not): ``verdict``.

    Example: an alternative at 11 s and 70 GiB against a plan at 10 s and 60 GiB "loses" with the text
    ``slower by 10.0 %; needs 10.0 GiB more``.
    """
    alt = rep.alternatives[index]
    return verdict(rep.estimate, alt.estimate, limit=rep.limit, label=alt.label)


def verdict(base: Estimate, other: Estimate, *, limit: float, label: str) -> Comparison:
    """How ``other`` compares with ``base`` against a per-GPU memory ``limit``: the relative step time with the
    components it loses time in, the memory, and the status (``loses``, ``better``, ``trade-off``, ``same``,
    ``does not fit``). The one home of "why it loses" (reports and the plan search alike)."""
    dt = other.step_time / base.step_time - 1.0
    dm = other.peak_memory - base.peak_memory
    behind = components_behind(base, other)
    t_txt = (f"slower by {100 * dt:.1f} %" + (f" ({behind})" if behind else "") if dt > SAME_TIME else
             f"faster by {100 * -dt:.1f} %" if dt < -SAME_TIME else "same step time")
    m_txt = (f"needs {gib(dm)} GiB more" if dm > SAME_MEMORY else
             f"needs {gib(-dm)} GiB less" if dm < -SAME_MEMORY else "same memory")
    fits = other.peak_memory <= limit
    status = _status(dt, dm, fits)
    text = f"{t_txt}; {m_txt}"
    if fits and base.peak_memory > limit:
        status, text = "better", f"fits where this plan does not; {text}"
    elif not fits:
        text = f"needs {gib(other.peak_memory)} GiB, over the {gib(limit)} GiB limit; {t_txt}"
    return Comparison(label=label, status=status, time_delta=dt, memory_delta=dm, text=text)


def components_behind(base: Estimate, other: Estimate, *, n: int = 2) -> str:
    """The (at most ``n``) time components in which ``other`` takes longer than ``base`` by more than 0.5 % of
    base's step, largest first, e.g. ``compute +0.40 s, pipeline bubble +0.20 s``; recompute is inside compute."""
    a, b = base.time.as_dict(), other.time.as_dict()
    diffs = sorted(((b[k] - a[k], k) for k in a if k != "recompute"), reverse=True)
    return ", ".join([f"{component_name(k)} +{d:.2f} s" for d, k in diffs if d > 0.005 * base.step_time][:n])


def _status(dt: float, dm: float, fits: bool) -> str:
    """Verdict from the relative time and absolute memory differences."""
    if not fits:
        return "does not fit"
    worse = dt > SAME_TIME or dm > SAME_MEMORY
    better = dt < -SAME_TIME or dm < -SAME_MEMORY
    if worse and not better:
        return "loses"
    if better and not worse:
        return "better"
    return "trade-off" if worse else "same"


def comparisons(rep: Report) -> list[Comparison]:
    """Every alternative compared with the reported plan, in the given order."""
    return [compare(rep, i) for i in range(len(rep.alternatives))]
