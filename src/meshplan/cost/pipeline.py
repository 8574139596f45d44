"""Closed forms of pipeline step time and in-flight activations, from each schedule's analytic functions in the
schedule registry (``meshplan.spec.schedules``).

The event simulator (``meshplan.sim``) is the ground truth; these closed forms are the fast path the estimate
and the search use. Tests hold them equal to the simulator on uniform stages without transfer time for every
schedule whose spec says ``closed_form_exact`` (m >= pp); the transfer term is first order (exact for GPipe and
for 1F1B when pp divides m; within a few transfer times otherwise while a transfer is short against a chunk's
compute).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.cost.result import StageTimes
from meshplan.spec.schedules import rank_stages, schedule_spec


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


def stage_rank(schedule: str, *, stage: int, pp: int) -> int:
    """Rank holding ``stage`` (pipeline order) under the schedule's placement (looped or V)."""
    return schedule_spec(schedule).stage_rank(stage=stage, pp=pp)


def rank_work(times: StageTimes, *, pp: int, rank: int, schedule: str = "1f1b") -> tuple[float, float, float]:
    """Per micro-batch forward, backward-input and backward-weight time of all chunks on ``rank`` (s)."""
    idx = rank_stages(schedule, pp=pp, n_stages=times.n_stages)[rank]
    return (sum(times.fwd[i] for i in idx), sum(times.bwd_input[i] for i in idx),
            sum(times.bwd_weight[i] for i in idx))


def closed_form(schedule: str, times: StageTimes, *, pp: int, vpp: int, n_micro: int) -> PipelineTime:
    """Pipeline time for a registered schedule with possibly non-uniform stages.

    Step = m * (slowest rank's work per micro-batch) + the schedule's fill (``ScheduleSpec.fill``) + exposed
    transfers (``ScheduleSpec.p2p_factor`` times the largest send). For 1F1B on equal stages: ``(m + p - 1) W``,
    bubble share ``(p-1)/(m+p-1)``; interleaved: bubble ``(p-1) W / v``.
    """
    spec = schedule_spec(schedule)
    work = [rank_work(times, pp=pp, rank=r, schedule=schedule) for r in range(pp)]
    busy = n_micro * max(sum(w) for w in work)
    if pp == 1:
        return PipelineTime(step=busy, busy=busy, bubble=0.0, p2p=0.0)
    fill = spec.fill(work, pp, vpp, n_micro)
    p2p = spec.p2p_factor(pp, vpp, n_micro) * max(times.p2p[:-1] or (0.0,))
    return PipelineTime(step=busy + fill + p2p, busy=busy, bubble=fill, p2p=p2p)


def inflight_microbatches(schedule: str, *, pp: int, vpp: int, n_micro: int, rank: int,
                          w_hold: float = 0.5) -> float:
    """Micro-batches whose activations rank ``rank`` holds at its peak, in units of the rank's whole share of
    one micro-batch (all its chunks); equal to the simulator's ``peak_inflight`` on uniform stages
    (``ScheduleSpec.inflight``; ``w_hold``: the share of a deferred weight-gradient pass's inputs held)."""
    if pp == 1 or n_micro == 0:
        return float(min(n_micro, 1))
    return schedule_spec(schedule).inflight(pp, vpp, n_micro, rank, w_hold)
