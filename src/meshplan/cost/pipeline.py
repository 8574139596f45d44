"""Closed forms of pipeline step time and in-flight activations for the standard schedules.

The event simulator (``meshplan.sim``) is the ground truth; these closed forms are the fast path the estimate
and the search use, and tests hold them equal to the simulator on uniform stages.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.cost.result import StageTimes


@dataclass(frozen=True, kw_only=True)
class PipelineTime:
    """Step time of the pipeline part of a step, and where it goes."""

    step: float
    """Time from the first forward to the last backward on any rank (s)."""
    busy: float
    """Compute time of the busiest rank (s)."""
    bubble: float
    """Idle time of the busiest rank inside the step (s)."""
    p2p: float
    """Exposed send/receive time on the critical path (s)."""


def rank_work(times: StageTimes, *, pp: int, rank: int) -> tuple[float, float, float]:
    """Per micro-batch forward, backward-input and backward-weight time of all chunks on ``rank`` (s)."""
    idx = range(rank, times.n_stages, pp)
    return (sum(times.fwd[i] for i in idx), sum(times.bwd_input[i] for i in idx),
            sum(times.bwd_weight[i] for i in idx))


def closed_form(schedule: str, times: StageTimes, *, pp: int, vpp: int, n_micro: int) -> PipelineTime:
    """Pipeline time for a standard schedule with possibly non-uniform stages.

    1F1B and GPipe (Narayanan et al. 2021, eq. 1, generalized to unequal stages): the slowest rank runs every
    micro-batch back to back, the others add their own fill and drain:
    ``T = m * max_r W_r + sum_r W_r - max_r W_r``, which for equal stages is ``(m + p - 1) W``, bubble
    ``(p-1)/(m+p-1)``. Interleaved 1F1B with v chunks (Narayanan et al. 2021, sec. 2.2.2) divides the fill
    and drain by v. Zero-bubble ZB-H1 (Qi et al. 2023, sec. 3) fills the drain with deferred weight-gradient
    work, leaving a bubble of ``(p-1)(F + B - W)`` per rank.
    """
    work = [sum(rank_work(times, pp=pp, rank=r)) for r in range(pp)]
    wmax = max(work)
    if pp == 1:
        return PipelineTime(step=n_micro * wmax, busy=n_micro * wmax, bubble=0.0, p2p=0.0)
    hops = 2 * (pp - 1)
    p2p = hops * max(times.p2p[:-1] or (0.0,))
    fill = sum(work) - wmax
    if schedule in ("interleaved_1f1b",):
        fill /= max(vpp, 1)
    elif schedule in ("zb_h1", "zbv", "dualpipev"):
        f, b, w = zip(*(rank_work(times, pp=pp, rank=r) for r in range(pp)))
        # Deferred W passes fill the cool-down: the bubble shrinks from (p-1)(F+B+W) to (p-1)(F+B-W).
        per = [max(fi + bi - wi, 0.0) for fi, bi, wi in zip(f, b, w)]
        fill = sum(per) - max(per) if schedule == "zb_h1" else (sum(per) - max(per)) / 2
    busy = n_micro * wmax
    return PipelineTime(step=busy + fill + p2p, busy=busy, bubble=fill, p2p=p2p)


def inflight_microbatches(schedule: str, *, pp: int, vpp: int, n_micro: int, rank: int) -> float:
    """Micro-batches whose activations rank ``rank`` holds at its peak, in units of the rank's whole share of
    one micro-batch (all its chunks).

    GPipe keeps all m; 1F1B keeps p - r (Narayanan et al. 2021, sec. 2.2.1); interleaved keeps
    ``p - r + (p - 1 - r)/v`` warm-up chunks (Narayanan et al. 2021 / Korthikanti et al. 2022 sec. 4.2.3:
    first stage ``p (1 + (p-1)/(p v))``); ZB-H1 keeps the same as 1F1B (Qi et al. 2023) but W-deferred inputs
    add up to p - r more weight-gradient inputs, counted at half a micro-batch.
    """
    m = n_micro
    if pp == 1:
        return 1.0
    if schedule == "gpipe":
        return float(m)
    base = float(min(pp - rank, m))
    if schedule == "interleaved_1f1b":
        return min(base + (pp - 1 - rank) / max(vpp, 1), float(m))
    if schedule == "zb_h1":
        return min(base * 1.5, float(m))
    if schedule in ("zbv", "dualpipev"):
        return min(2.0 * pp / 2 + 0.5, float(m))
    return base
