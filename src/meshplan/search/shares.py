"""Uneven data-parallel batch shares on mixed clusters (HetPipe, Park et al. 2020; Sailor, Strati et al. 2024;
FlashFlex, Yan et al. 2024): every replica lives on one pool, and a replica on a faster pool runs more
micro-batches per step so that all replicas finish together.

A leaf's shares candidate puts dp outermost (each replica a contiguous block of tp*cp*pp GPUs, pools in cluster
order), keeps ZeRO shards inside a pool, and sizes the shares with ``proportional_shares``.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush
from math import gcd
from typing import Callable

from meshplan.search.bounds import LayerTable, pipeline_factor
from meshplan.spec.checks import replicas_per_pool
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import Plan

DP_OUTER_ORDER = "tp-cp-ep-pp-dp"
"""Rank order of a shares plan with a pipeline: each data-parallel replica is one contiguous block."""


def proportional_shares(replicas: tuple[int, ...], finish: Callable[[int, int], float],
                        total: int) -> tuple[int, ...] | None:
    """Micro-batches per replica of each pool, >= 1 each, with sum_i replicas_i * s_i = ``total``, minimizing
    the slowest pool's ``finish(i, s_i)`` (s; non-decreasing in s). Greedy: give the next micro-batch round to
    the pool that would finish it first; optimal for min-max when the pools' replica counts are equal, and when
    ``finish`` is linear it is the speed-proportional split rounded (shares ~ 1 / time per micro-batch). Where
    the greedy cannot hit ``total`` exactly (replica counts such as 3 and 2), ``exact_shares`` decides. None
    when no shares add up to ``total``.

    Example: replicas (4, 4), finish(i, s) = s * (2.0, 1.0)[i], total 48 -> (4, 8): both finish at 8 s
    (tests/unit/test_batch_shares.py).
    """
    shares = [1] * len(replicas)
    left = total - sum(replicas)
    if left < 0:
        return None
    heap = [(finish(i, 2), i) for i in range(len(replicas))]
    heapify(heap)
    while left and heap:
        _, i = heappop(heap)
        if replicas[i] > left:
            continue
        shares[i] += 1
        left -= replicas[i]
        heappush(heap, (finish(i, shares[i] + 1), i))
    return tuple(shares) if left == 0 else exact_shares(replicas, finish, total)


def _caps(replicas: tuple[int, ...], finish: Callable[[int, int], float], total: int, limit: float) -> list[int]:
    """Per pool the most micro-batches that finish within ``limit`` (at least 1, at most what the total allows)."""
    out = []
    for i, r in enumerate(replicas):
        lo, hi = 1, max((total - sum(replicas)) // r + 1, 1)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if finish(i, mid) <= limit else (lo, mid - 1)
        out.append(lo)
    return out


def _reach(replicas: tuple[int, ...], caps: list[int], total: int) -> tuple[int, ...] | None:
    """Shares with 1 <= s_i <= caps_i summing (weighted) to ``total`` exactly, or None: subset-sum over the pools
    with Python integers as bitsets, then a walk back through the stored layers."""
    mask = (1 << (total + 1)) - 1
    layers = [1]
    for r, cap in zip(replicas, caps):
        prev, cur = layers[-1], 0
        for s in range(1, cap + 1):
            cur |= prev << (r * s)
        layers.append(cur & mask)
    if not layers[-1] >> total & 1:
        return None
    shares, need = [], total
    for k in range(len(replicas) - 1, -1, -1):
        s = next(s for s in range(1, caps[k] + 1)
                 if need >= replicas[k] * s and layers[k] >> (need - replicas[k] * s) & 1)
        shares.append(s)
        need -= replicas[k] * s
    return tuple(reversed(shares))


def exact_shares(replicas: tuple[int, ...], finish: Callable[[int, int], float],
                 total: int) -> tuple[int, ...] | None:
    """The min-max shares with an exact total, by bisection on the slowest pool's time over the values
    ``finish`` takes, each step a subset-sum feasibility test (``_reach``)."""
    tops = _caps(replicas, lambda i, s: 0.0, total, 0.0)
    times = sorted({finish(i, s) for i in range(len(replicas)) for s in range(1, tops[i] + 1)})
    best = _reach(replicas, tops, total)
    lo, hi = 0, len(times) - 1
    while best is not None and lo < hi:
        mid = (lo + hi) // 2
        got = _reach(replicas, _caps(replicas, finish, total, times[mid]), total)
        lo, hi, best = (lo, mid, got) if got is not None else (mid + 1, hi, best)
    return best


def shares_template(model: ModelSpec, cluster: ClusterSpec, plan: Plan, *,
                    pins: dict | None = None) -> tuple[Plan, tuple[int, ...]] | None:
    """The leaf's layout with dp outermost and ZeRO shards inside a pool, and the replicas per pool; None when
    the cluster has one pool, a replica would straddle pools, shards/experts cannot stay inside a pool, or the
    layout contradicts a pinned rank order or dp_shard. ZeRO over all of dp (dp_shard 0) becomes the largest
    group every pool's replica count is a multiple of."""
    size = plan.tp * plan.cp * plan.pp
    if len(cluster.pools) < 2 or any(p.n_gpus % size for p in cluster.pools):
        return None
    order = DP_OUTER_ORDER if plan.pp > 1 else plan.rank_order
    probe = plan.with_(rank_order=order)
    reps = replicas_per_pool(cluster, probe)
    shard = plan.dp_shard
    if plan.zero:
        common = 0
        for r in reps:
            common = gcd(common, r)
        shard = shard or common
        if any(r % shard for r in reps):
            return None
    if model.is_moe and any((plan.tp * plan.cp * r) % (plan.ep * plan.etp) for r in reps):
        return None
    out = probe.with_(dp_shard=shard if plan.zero else 0)
    if any(getattr(out, k) != v for k, v in (pins or {}).items() if k in ("rank_order", "dp_shard")):
        return None
    return out, reps


def replica_floor(table: LayerTable, plan: Plan, n_micro: int) -> float:
    """Pipeline time of one replica on its pool with ``n_micro`` micro-batches, for any split (s):
    ``pipeline_factor`` times the average rank's work (``meshplan.search.bounds``)."""
    sched = plan.schedule_name if plan.pp > 1 else ""
    return pipeline_factor(sched, pp=plan.pp, vpp=plan.vpp, n_micro=n_micro, share=table.share) * table.work / plan.pp


def shares_leaf(template: tuple[Plan, tuple[int, ...]] | None, tables: list[LayerTable], plan: Plan, *,
                memo: dict, key: tuple) -> Plan | None:
    """The leaf with batch shares minimizing the slowest pool's ``replica_floor`` (``proportional_shares``;
    ``tables[i]``: per-layer costs on pool i; ``memo`` caches the shares under ``key``); None where shares do
    not apply or come out even (the even split is the leaf itself)."""
    if template is None:
        return None
    base, reps = template
    if key not in memo:
        memo[key] = proportional_shares(reps, lambda i, m: replica_floor(tables[i], plan, m),
                                        plan.global_batch // plan.micro_batch)
    shares = memo[key]
    if shares is None or len(set(shares)) == 1:
        return None
    return base.with_(batch_shares=shares)


def shares_floor(replicas: tuple[int, ...], works: tuple[float, ...], *, total: int, pp: int) -> float:
    """Pipeline time of any shares (s): replica i takes at least s_i W_i / pp (no bubble), and
    sum_i replicas_i s_i = ``total`` gives max_i s_i W_i / pp >= total / (pp sum_i replicas_i / W_i)."""
    return total / (pp * sum(r / max(w, 1e-30) for r, w in zip(replicas, works)))
