"""Closed forms of pipeline step time and in-flight activations for the standard schedules.

The event simulator (``meshplan.sim``) is the ground truth; these closed forms are the fast path the estimate
and the search use. Tests hold them equal to the simulator on uniform stages without transfer time for every
schedule in ``EXACT_ON_UNIFORM`` (m >= pp); the transfer term is first order (exact for GPipe and for 1F1B when
pp divides m; within a few transfer times otherwise while a transfer is short against a chunk's compute).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from meshplan.cost.result import StageTimes

EXACT_ON_UNIFORM = ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1")
"""Schedules whose closed form equals the simulator on uniform stages with zero p2p time and m >= pp.
``zbv`` and ``dualpipev`` match only for F = I = W; estimates should simulate them."""
V_SHAPED = ("zbv", "dualpipev")
"""Schedules that place stage r and 2pp-1-r on rank r (all others place stage chunk*pp + rank on rank)."""


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
    """Rank holding ``stage`` (pipeline order): V placement for V_SHAPED schedules, looped otherwise."""
    chunk, pos = divmod(stage, pp)
    if schedule in V_SHAPED and chunk % 2 == 1:
        return pp - 1 - pos
    return pos


@lru_cache(maxsize=4096)
def rank_stages(schedule: str, *, pp: int, n_stages: int) -> tuple[tuple[int, ...], ...]:
    """Stages held by each rank, in pipeline order (computed once per placement; search calls it often)."""
    out: list[list[int]] = [[] for _ in range(pp)]
    for s in range(n_stages):
        out[stage_rank(schedule, stage=s, pp=pp)].append(s)
    return tuple(tuple(x) for x in out)


def rank_work(times: StageTimes, *, pp: int, rank: int, schedule: str = "1f1b") -> tuple[float, float, float]:
    """Per micro-batch forward, backward-input and backward-weight time of all chunks on ``rank`` (s)."""
    idx = rank_stages(schedule, pp=pp, n_stages=times.n_stages)[rank]
    return (sum(times.fwd[i] for i in idx), sum(times.bwd_input[i] for i in idx),
            sum(times.bwd_weight[i] for i in idx))


def _fill(schedule: str, work: list[tuple[float, float, float]], *, pp: int, vpp: int, n_micro: int) -> float:
    """Idle time of the slowest rank without transfers; every formula reduces to the simulator's on uniform
    stages (F, I, W per rank, all chunks):

    - GPipe, 1F1B (Narayanan et al. 2021 eq. 1, unequal stages): sum_r W_r - max_r W_r = (p-1)(F+I+W).
    - Interleaved (ibid. sec. 2.2.2): (p-1)(F+I+W)/v, plus (v-1)(p-m)(F+I+W)/v when m < p.
    - ZB-H1 (Qi et al. 2023 sec. 3.1): (p-1) max(F+I-W, I); the paper's (p-1)(F+B-W) when W <= F.
    - ZB-V, DualPipeV: (p-1) max(F+I-W, I) / 2, exact only for F = I = W (Qi et al. 2024 sec. 6 /
      DeepSeek-AI 2024 table 2 give the same direction); use the simulator otherwise.
    """
    total = [sum(w) for w in work]
    base = sum(total) - max(total)
    if schedule in ("gpipe", "1f1b"):
        return base / (max(vpp, 1) if schedule == "gpipe" else 1)
    if schedule == "interleaved_1f1b":
        v = max(vpp, 1)
        return base / v + (v - 1) * max(pp - n_micro, 0) * max(total) / v
    per = [max(f + i - w, i) for f, i, w in work]
    fill = sum(per) - max(per)
    return fill / 2 if schedule in V_SHAPED else fill


def _exposed_p2p(schedule: str, t: float, *, pp: int, vpp: int, n_micro: int) -> float:
    """Transfer time on the critical path, first order in the largest stage-to-stage send time ``t``.

    1F1B pays one down-and-up trip per pp micro-batches in steady state (its warm-up leaves no slack); GPipe
    pays one trip over the pp ranks; the others pay the fill and drain trips over all pp*v stages once
    (simulator-derived; see tests/unit/test_sim_closed_form.py).
    """
    hops = pp * max(vpp, 1) - 1
    if schedule == "gpipe":
        return 2 * (pp - 1) * t
    if schedule == "1f1b":
        return 2 * t * ((pp - 1) * (1 + n_micro / pp) - 1)
    if schedule == "zb_h1":
        return 4 * (pp - 1) * t
    return 2 * hops * t


def closed_form(schedule: str, times: StageTimes, *, pp: int, vpp: int, n_micro: int) -> PipelineTime:
    """Pipeline time for a standard schedule with possibly non-uniform stages.

    Step = m * (slowest rank's work per micro-batch) + fill/drain bubble + exposed transfers; see ``_fill``
    and ``_exposed_p2p`` for the sources. For 1F1B on equal stages: ``(m + p - 1) W``, bubble share
    ``(p-1)/(m+p-1)``; interleaved: bubble ``(p-1) W / v``.
    """
    work = [rank_work(times, pp=pp, rank=r, schedule=schedule) for r in range(pp)]
    wmax = max(sum(w) for w in work)
    busy = n_micro * wmax
    if pp == 1:
        return PipelineTime(step=busy, busy=busy, bubble=0.0, p2p=0.0)
    fill = _fill(schedule, work, pp=pp, vpp=vpp, n_micro=n_micro)
    p2p = _exposed_p2p(schedule, max(times.p2p[:-1] or (0.0,)), pp=pp, vpp=vpp, n_micro=n_micro)
    return PipelineTime(step=busy + fill + p2p, busy=busy, bubble=fill, p2p=p2p)


def inflight_microbatches(schedule: str, *, pp: int, vpp: int, n_micro: int, rank: int,
                          w_hold: float = 0.5) -> float:
    """Micro-batches whose activations rank ``rank`` holds at its peak, in units of the rank's whole share of
    one micro-batch (all its chunks); equal to the simulator's ``peak_inflight`` on uniform stages.

    GPipe keeps all m; 1F1B keeps p - r (Narayanan et al. 2021, sec. 2.2.1); interleaved keeps its warm-up
    forwards plus one, ``(v-1) g + 2(p-1-r) + 1`` chunk-micro-batches with g micro-batches per round
    (Korthikanti et al. 2022 sec. 4.2.3: first stage ``p + (p-1)/v``); ZB-H1 adds the ``w_hold`` share of its r
    deferred W passes; ZB-V keeps p (Qi et al. 2024: same peak as 1F1B's first stage); DualPipeV p + 1/2
    (DeepSeek-AI 2024: PP + 1 chunk activations).
    """
    m, p, r = n_micro, pp, rank
    if p == 1 or m == 0:
        return float(min(m, 1))
    if schedule == "gpipe":
        return float(m)
    base = float(min(p - r, m))
    if schedule == "interleaved_1f1b" and vpp > 1:
        per_round = m // max(1, m // p)
        warm = (vpp - 1) * per_round + 2 * (p - 1 - r) + 1
        return min(warm, m * vpp) / vpp
    if schedule == "zb_h1":
        return base + w_hold * min(r, m - base)
    if schedule == "zbv":
        return min(float(p), float(m), (m + r + 1) / 2)
    if schedule == "dualpipev":
        return p + 0.5
    return base
