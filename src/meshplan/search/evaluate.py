"""Evaluating candidates with the full cost model: one plan's estimate (``evaluate``), whether it fits, the least
recompute that makes a leaf fit (``ladder``), and the refinement of the best plans with the partition kernel's
split and other rank orders (``refine``). Fitting plans go to the search's ``Front``."""

from __future__ import annotations

import math
from bisect import insort
from dataclasses import dataclass, field

from meshplan.cost.estimate import estimate, rank_pool
from meshplan.errors import MeshplanError
from meshplan.search.result import RankedPlan
from meshplan.search.split import balanced_split
from meshplan.search.state import CostCache, SearchSpace, Tally, dollars_per_hour
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.plan import DEFAULT_RANK_ORDER, Plan

RANK_ORDERS = (DEFAULT_RANK_ORDER, "tp-cp-ep-pp-dp", "tp-dp-cp-ep-pp")
"""Rank orders tried on the best plans: Megatron's default, pipeline inside data parallel (pipeline sends on
the fast links), and cp outside dp (cp's ring across nodes, dp's traffic inside)."""


@dataclass(kw_only=True)
class Front:
    """The fitting plans found so far and their objectives in order (the bound prunes against the best)."""

    plans: list[RankedPlan] = field(default_factory=list)
    """Every fitting plan evaluated."""
    keys: list[float] = field(default_factory=list)
    """Their objectives, sorted."""

    def bound_key(self, top: int) -> float:
        """Objective of the ``top``-th best fitting plan so far (inf until there are that many): a candidate
        whose bound is no better cannot enter the ranked table."""
        return self.keys[top - 1] if len(self.keys) >= top else math.inf

    def add(self, space: SearchSpace, rp: RankedPlan) -> None:
        """Record a fitting plan."""
        self.plans.append(rp)
        insort(self.keys, space.key(rp.cluster, rp.estimate.step_time, rp.plan))


@dataclass(kw_only=True)
class Evaluation:
    """What evaluating candidates reads and writes: the space, the cost cache, the tally, the front."""

    space: SearchSpace
    cache: CostCache
    tally: Tally
    front: Front = field(default_factory=Front)


def over(space: SearchSpace, rp: RankedPlan) -> float:
    """Bytes by which the tightest rank exceeds its memory limit (<= 0: fits). Shares plans: the estimate reports
    the pool with the highest peak relative to its device memory."""
    est = rp.estimate
    if rp.plan.batch_shares:
        return est.peak_memory - space.request.max_memory_fraction * est.capacity
    return max(m.total() - lim for m, lim in zip(est.memory_per_stage, space.limits(rp.cluster, rp.plan)))


def fits(space: SearchSpace, rp: RankedPlan) -> bool:
    """Every rank's peak within its pool's limit."""
    if rp.plan.batch_shares:
        return over(space, rp) <= 0
    lims = space.limits(rp.cluster, rp.plan)
    return all(m.total() <= lim for m, lim in zip(rp.estimate.memory_per_stage, lims))


def evaluate(ev: Evaluation, variant: ClusterSpec, plan: Plan) -> RankedPlan | None:
    """The full cost model on one plan (None, counted, when the plan turns out invalid)."""
    space, tally = ev.space, ev.tally
    tally.evaluated += 1
    try:
        est = estimate(space.model, variant, plan, stack=space.request.framework, calib=space.calib)
    except MeshplanError:
        tally.pruned["invalid after split"] += 1
        return None
    rp = RankedPlan(plan=plan, cluster=variant, estimate=est,
                    dollars_per_hour=dollars_per_hour(variant, space.request.prices))
    if plan.batch_shares:
        ratio = est.peak_memory / (space.request.max_memory_fraction * est.capacity)
    else:
        ratio = max(m.total() / lim for m, lim in zip(est.memory_per_stage, space.limits(variant, plan)))
    tally.note_plan(ratio, rp)
    return rp


def split(space: SearchSpace, cache: CostCache, variant: ClusterSpec, plan: Plan, *,
          force: bool = False) -> tuple[int, ...]:
    """Layer split: even on one pool (the published family), the kernel's on mixed pools or when forced."""
    if plan.pp == 1 or (variant.homogeneous and not force) or plan.batch_shares:
        return ()
    tabs = [cache.table(rank_pool(variant, plan, r), plan) for r in range(plan.pp)]
    return balanced_split(space.model, plan, tables=tabs, limits=space.limits(variant, plan)) or ()


def _with_recompute(ev: Evaluation, variant: ClusterSpec, plan: Plan, mode: str, k: int = 0) -> RankedPlan | None:
    """The plan under a recompute mode, split re-balanced for it on mixed pools."""
    p = plan.with_(recompute=mode, recompute_layers=k, layer_split=())
    return evaluate(ev, variant, p.with_(layer_split=split(ev.space, ev.cache, variant, p)))


def ladder(ev: Evaluation, variant: ClusterSpec, plan: Plan) -> None:
    """Least recompute that fits: none; else selective and full on the fewest layers per rank. A pinned mode is
    the only one tried, even where less recompute would fit."""
    space = ev.space
    pins = space.request.pins
    pin = pins.get("recompute", "full" if "recompute_layers" in pins else None)  # a layer count means full
    base = _with_recompute(ev, variant, plan, "none")
    if base is None:
        return
    if pin in (None, "none"):
        if fits(space, base):
            ev.front.add(space, base)
            return
        if pin == "none":
            ev.tally.pruned["memory"] += 1
            return
        if not space.request.exhaustive and space.key(variant, base.estimate.step_time, base.plan) >= \
                ev.front.bound_key(space.request.top):
            ev.tally.pruned["bound (recompute only adds time)"] += 1
            return
    found = False
    if pin in (None, "selective") and space.selective_allowed() and any(b.layer.attention for b in space.model.blocks):
        sel = _with_recompute(ev, variant, plan, "selective")
        if sel is not None and fits(space, sel):
            ev.front.add(space, sel)
            found = True
    full = None
    if pin in (None, "full") and "full" in space.request.framework.recompute_modes:
        full = _with_recompute(ev, variant, plan, "full")
    if full is None or not fits(space, full):
        ev.tally.pruned["memory"] += 0 if found else 1
        return
    _partial_full(ev, variant, plan, base, full)


def _partial_full(ev: Evaluation, variant: ClusterSpec, plan: Plan, base: RankedPlan, full: RankedPlan) -> None:
    """Fewest fully recomputed layers per rank that fit, from a linear guess between none and all."""
    space = ev.space
    per_rank = max(sum(full.plan.layer_split[r::plan.pp]) for r in range(plan.pp)) if full.plan.layer_split \
        else -(-space.model.n_layers // plan.pp)
    span = max(base.estimate.peak_memory - full.estimate.peak_memory, 1.0)
    k = max(1, math.ceil(over(space, base) / span * per_rank))
    if "recompute_layers" in space.request.pins:  # the pinned count only, fitting or not
        k = space.request.pins["recompute_layers"] or per_rank
        rp = full if k >= per_rank else _with_recompute(ev, variant, plan, "full", k)
        if rp is not None and fits(space, rp):
            ev.front.add(space, rp)
        else:
            ev.tally.pruned["memory"] += 1
        return
    while k < per_rank:
        rp = _with_recompute(ev, variant, plan, "full", k)
        if rp is not None and fits(space, rp):
            ev.front.add(space, rp)
            return
        k += max(1, per_rank // 16)
    ev.front.add(space, full)


def refine(ev: Evaluation) -> None:
    """Try the partition kernel's split and other rank orders on the best distinct plans."""
    space = ev.space
    best = sorted(ev.front.plans, key=lambda rp: rp.estimate.step_time)[: 2 * space.request.top]
    for rp in best:
        tries = []
        if rp.plan.pp > 1 and not rp.plan.layer_split:
            tries.append(rp.plan.with_(layer_split=split(space, ev.cache, rp.cluster, rp.plan, force=True)))
        if rp.cluster.homogeneous and "rank_order" not in space.request.pins:
            tries += [rp.plan.with_(rank_order=o) for o in RANK_ORDERS if o != rp.plan.rank_order]
        for p in tries:
            if p == rp.plan:
                continue
            new = evaluate(ev, rp.cluster, p)
            if new is not None and fits(space, new) and new.estimate.step_time < rp.estimate.step_time:
                ev.front.add(space, new)
