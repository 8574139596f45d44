"""The layer-partition kernel: split a sequence of layers into contiguous stages so that the slowest stage is
as fast as possible while every stage fits its memory (the min-max stage DP of alpa's inter-operator pass and
of PipeDream's planner, with per-stage speed and memory as in HAPT / Metis for mixed GPUs).

Pure numbers in, counts out: the driver builds the problem from the cost model.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate


@dataclass(frozen=True, kw_only=True)
class PartitionProblem:
    """Layers with a time and a memory weight, and stages with a speed, fixed costs and a capacity."""

    item_time: tuple[float, ...]
    """Time of each layer on a stage of speed 1 (s)."""
    item_mem: tuple[float, ...]
    """Memory weight of each layer (bytes, before the stage's multiplier)."""
    stage_slowdown: tuple[float, ...]
    """Per stage: time multiplier (1 = reference GPU, 2 = half as fast)."""
    stage_time: tuple[float, ...]
    """Per stage: fixed time (embedding, output head) (s)."""
    stage_mem_scale: tuple[float, ...]
    """Per stage: multiplier on layer memory (e.g. in-flight micro-batches of activations)."""
    stage_mem: tuple[float, ...]
    """Per stage: fixed memory (embedding, logits, CUDA context) (bytes)."""
    stage_capacity: tuple[float, ...]
    """Per stage: memory limit (bytes)."""
    min_items: int = 1
    """Fewest layers a stage may hold."""


def _greedy(prob: PartitionProblem, limit: float, pt: list[float], pm: list[float]) -> list[int] | None:
    """Largest prefix per stage under time ``limit`` and the memory caps; None if the layers do not fit.
    Greedy is optimal for feasibility: a stage's cost only grows with more layers, so ending a stage later
    never hurts the stages after it."""
    n, s_count = len(pt) - 1, len(prob.stage_slowdown)
    start, out = 0, []
    for s in range(s_count):
        left = s_count - s - 1
        hi = n - left * prob.min_items
        if s == s_count - 1:
            j = n
        else:
            t_room = (limit - prob.stage_time[s]) / prob.stage_slowdown[s]
            m_room = (prob.stage_capacity[s] - prob.stage_mem[s]) / max(prob.stage_mem_scale[s], 1e-30)
            j = min(bisect_right(pt, pt[start] + t_room * (1 + 1e-12)) - 1,
                    bisect_right(pm, pm[start] + m_room * (1 + 1e-12)) - 1, hi)
        if j - start < prob.min_items:
            return None
        t = prob.stage_time[s] + prob.stage_slowdown[s] * (pt[j] - pt[start])
        m = prob.stage_mem[s] + prob.stage_mem_scale[s] * (pm[j] - pm[start])
        if t > limit * (1 + 1e-9) or m > prob.stage_capacity[s] * (1 + 1e-9):
            return None
        out.append(j - start)
        start = j
    return out


def min_max_partition(prob: PartitionProblem, *, iters: int = 60) -> tuple[int, ...] | None:
    """Layers per stage minimizing the slowest stage's time subject to each stage's memory, or None when no
    contiguous split fits. Bisection on the bottleneck time with the greedy feasibility test above.

    Example: four 1 s layers on two stages, the second twice as slow: (2, 2) costs max(2, 4) = 4 s, (3, 1)
    costs max(3, 2) = 3 s, so the answer is (3, 1) (tests/unit/test_search_partition.py).
    """
    n, s_count = len(prob.item_time), len(prob.stage_slowdown)
    if n < s_count * prob.min_items:
        return None
    pt = [0.0, *accumulate(prob.item_time)]
    pm = [0.0, *accumulate(prob.item_mem)]
    hi = max(prob.stage_time) + max(prob.stage_slowdown) * pt[-1]
    best = _greedy(prob, hi, pt, pm)
    if best is None:
        return None
    lo = 0.0
    for _ in range(iters):
        mid = (lo + hi) / 2
        got = _greedy(prob, mid, pt, pm)
        if got is None:
            lo = mid
        else:
            hi, best = mid, got
        if hi - lo <= 1e-9 * hi:
            break
    return tuple(best)
