"""Objective lower bounds of a group of leaves, a leaf and a batch-shares leaf, from the cached per-layer costs
(``CostCache``) and the numeric bounds of ``bounds``, ``even`` and ``shares``. Each holds for any layer split, so
the driver can discard a candidate before running the full cost model; tests/unit/test_bounds_sound.py holds them
below the estimate on random leaves."""

from __future__ import annotations

from meshplan.cost.estimate import rank_pool
from meshplan.search.bounds import (
    dp_exact,
    group_pipeline_floor,
    group_time_bound,
    mixed_pipeline_floor,
    mixed_schedule_bound,
    recompute_extra,
    static_lower_bound,
    time_lower_bound,
)
from meshplan.search.even import even_pipeline_bound, even_split_work
from meshplan.search.shares import replica_floor, shares_floor
from meshplan.search.state import CostCache, SearchSpace, layer_key
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.plan import Plan
from meshplan.spec.schedules import schedule_spec


def group_bound(space: SearchSpace, cache: CostCache, variant: ClusterSpec, plan: Plan, cap: float,
                pipelines=()) -> tuple[float | None, float]:
    """(bound, static memory share) of every leaf of a group (``plan`` is its 1F1B member): the least over its
    ``pipelines`` of the pipeline bound with the recompute memory forces (``group_pipeline_floor``), the mixed-pool
    or shares floor, the optimizer and overhead. The bound is None when the static memory alone cannot fit, or no
    schedule of the group fits under full recompute; the share (static bound / ``cap``) is returned either way."""
    fast = cache.fastest(variant, plan)
    mem = static_lower_bound(fast, plan)
    exhaustive = space.request.exhaustive
    if mem > cap and not exhaustive:
        return None, mem / cap
    pipe = 0.0
    if pipelines and not exhaustive:
        pipe = group_pipeline_floor(fast, plan, pipelines, limit=cap, selective=space.selective_allowed(),
                                    static=mem)
        if pipe is None:
            return None, mem / cap
    # The group's leaves hold the head on the last rank (looped) or on rank 0 (V-shaped): the lower floor.
    v_shaped = any(schedule_spec(sched).placement == "v" for sched, _ in pipelines if sched)
    heads = {plan.pp - 1} | ({0} if v_shaped else set())
    floor = min(mixed_floor(cache, variant, plan, head_rank=h) for h in heads)
    tpl = cache.shares_base(variant, plan)
    if tpl is not None:
        reps, works = tpl[1], tuple(cache.table(p, plan).work for p in variant.pools)
        floor = min(floor, shares_floor(reps, works, total=plan.global_batch // plan.micro_batch, pp=plan.pp))
    bound = max(group_time_bound(fast, plan), max(pipe, floor) + group_time_bound(fast, plan, m=0))
    return space.key(variant, bound), mem / cap


def leaf_bound(space: SearchSpace, cache: CostCache, variant: ClusterSpec, plan: Plan, cap: float) -> float | None:
    """Objective lower bound of a leaf, or None when it cannot fit even with full recompute."""
    fast = cache.fastest(variant, plan)
    extra = recompute_extra(fast, plan, limit=cap, selective=space.selective_allowed())
    if extra is None and not space.request.exhaustive:
        return None
    one = variant.pools[0]
    dp = dp_exact(fast, plan, pool=one, calib=space.calib) if variant.homogeneous else None
    floor = mixed_floor(cache, variant, plan, fill=True)
    if variant.homogeneous and plan.pp > 1 and not extra:
        # The main phase evaluates the even split on one pool: bound that split itself.
        even = even_split_work(space.model, fast, plan)
        floor = even_pipeline_bound(even, fast, plan, pool=one, calib=space.calib)
    return space.key(variant, time_lower_bound(fast, plan, p2p=cache.p2p(variant, plan), extra_work=extra or 0.0,
                                               dp=dp, pipe_floor=floor))


def shares_bound(space: SearchSpace, cache: CostCache, variant: ClusterSpec, plan: Plan, cap: float) -> float | None:
    """Objective lower bound of a shares plan: the leaf bound on the fastest pool (no p2p: the slowest replica's
    sends are not known; no data-parallel term), raised to the slowest pool's pipeline bound for its share
    (``replica_floor``)."""
    fast = cache.fastest(variant, plan)
    extra = recompute_extra(fast, plan, limit=cap, selective=space.selective_allowed())
    if extra is None and not space.request.exhaustive:
        return None
    floor = max(replica_floor(cache.table(p, plan), plan, s) for p, s in zip(variant.pools, plan.batch_shares))
    return space.key(variant, time_lower_bound(fast, plan, extra_work=extra or 0.0, pipe_floor=floor))


def mixed_floor(cache: CostCache, variant: ClusterSpec, plan: Plan, *, head_rank: int | None = None,
                fill: bool = False) -> float:
    """Mixed pools: ``mixed_pipeline_floor`` of the ranks' layer work on their pools (the fastest pool's, times the
    smallest per-block slowdown of the rank's pool), the head on the rank that holds the last stage, and at least
    vpp layers per rank (every split search evaluates gives each virtual stage a layer); m of them bound the step
    (s). With ``fill``, the plan's schedule adds its fill (``mixed_schedule_bound``, every layer at its fastest
    pool's pace). 0 on one pool."""
    if variant.homogeneous:
        return 0.0
    if head_rank is None:
        head_rank = schedule_spec(plan.schedule_name).stage_rank(stage=plan.n_stages - 1, pp=plan.pp)
    # Pools of pipeline ranks depend on n_gpus, pp and the rank order (in the layer key) only.
    key = (id(variant), layer_key(plan), plan.pp, plan.vpp, head_rank)
    if key not in cache.floors:
        cache.floors[key] = _rank_floor(cache, variant, plan, head_rank)
    busiest, total = cache.floors[key]
    if not fill:
        return plan.n_micro * busiest
    return mixed_schedule_bound(plan.schedule_name, pp=plan.pp, vpp=plan.vpp, n_micro=plan.n_micro,
                                share=cache.fastest(variant, plan).share, busiest=busiest, total=total)


def _rank_floor(cache: CostCache, variant: ClusterSpec, plan: Plan, head_rank: int) -> tuple[float, float]:
    """(busiest rank's least work, all ranks' least work) per micro-batch of any split on mixed pools (s)."""
    ref = cache.fastest(variant, plan)
    ref_layers = ref.work - ref.head
    layers, heads, least = [], [], []
    for r in range(plan.pp):
        t = cache.table(rank_pool(variant, plan, r), plan)
        # Blocks may slow down by different factors on another GPU: the smallest bounds every split.
        ratio = min(b.work / max(a.work, 1e-30) for b, a in zip(t.blocks, ref.blocks))
        layers.append(ratio * ref_layers)
        heads.append(t.head if r == head_rank else 0.0)
        least.append(plan.vpp * min(b.work for b in t.blocks))
    tabs = [cache.table(p, plan) for p in variant.pools]
    total = sum(min(t.blocks[i].work for t in tabs) * b.n_layers for i, b in enumerate(ref.blocks)) + \
        min(t.head for t in tabs)
    return mixed_pipeline_floor(layers, heads, least), total
