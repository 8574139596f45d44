"""The search driver: enumerate groups of leaves, bound them, evaluate survivors best-bound-first with the full
cost model (picking the least recompute that fits), refine the best with the layer-partition kernel and other
rank orders, and re-rank the top with the event simulator. The state is split into a frozen ``SearchSpace``, a
``CostCache``, a ``Tally`` and the ``Front`` of fitting plans (``state``, ``evaluate``); the bounds are pure
functions (``prune``); the numeric kernels live in ``bounds``, ``even``, ``shares`` and ``partition``."""

from __future__ import annotations

import time
from heapq import heappop, heappush
from typing import Callable

from meshplan.search import prune
from meshplan.search.evaluate import Evaluation, evaluate, ladder, refine
from meshplan.search.pins import check_request
from meshplan.search.rank import finish
from meshplan.search.request import SearchRequest
from meshplan.search.result import RankedPlan, SearchResult
from meshplan.search.space import leaf_plan
from meshplan.search.state import CostCache, SearchSpace, Tally
from meshplan.spec.checks import stack_violations
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.model import ModelSpec


def search(model: ModelSpec, cluster: ClusterSpec, request: SearchRequest, *, calib=None,
           progress: Callable[[int, int], None] | None = None) -> SearchResult:
    """Plan ``model`` on ``cluster`` for ``request``; see the module docstring for the steps.

    Args:
        calib: calibration table for the cost model (None = packaged).
        progress: optional ``f(done, total)`` called while candidates are evaluated.

    Raises:
        SpecError, PlanError: a pin or price is invalid, or the pins ask what the model, cluster or stack cannot
            give (``meshplan.search.pins``); a valid request that nothing fits returns ``infeasible`` instead.
    """
    t0 = time.perf_counter()
    check_request(model, cluster, request)
    space = SearchSpace.of(model, cluster, request, calib)
    ev = Evaluation(space=space, cache=CostCache(space=space), tally=Tally())
    heap = _bounded_groups(ev)
    done, seen = 0, set()
    while heap:
        lb, _, vi, g, cap, plan = heappop(heap)
        if not request.exhaustive and lb >= ev.front.bound_key(request.top):
            ev.tally.pruned["bound"] += (1 if plan is not None else len(g.pipelines)) + \
                sum(1 if it[5] is not None else len(it[3].pipelines) for it in heap)
            break
        if plan is None:
            _expand(ev, heap, vi, g, cap, seen)
            continue
        ladder(ev, space.variants[vi], plan)
        done += 1
        if progress and done % 32 == 0:
            progress(done, done + len(heap))
    if not request.exhaustive:
        refine(ev)
    return finish(space, ev.tally, ev.front.plans, t0=t0, lean=_leanest(ev) if not ev.front.plans else None)


def _bounded_groups(ev: Evaluation) -> list:
    """A heap of every group of leaves by its bound, ``(bound, tie-break, variant index, group, capacity, leaf)``
    (leaf None for a group; equal bounds pop in enumeration order); groups that cannot fit are counted and left
    out."""
    space, tally = ev.space, ev.tally
    heap: list = []
    for vi, g, cap in space.groups(tally.pruned):
        var = space.variants[vi]
        n = len(g.pipelines)
        tally.considered += n
        plan = leaf_plan(g.base._replace(schedule="1f1b" if g.base.deg.pp > 1 else ""), space.request)
        lb, share = prune.group_bound(space, ev.cache, var, plan, cap, g.pipelines)
        tally.note_leaf(share, var, plan)
        if lb is None:
            tally.pruned["memory (lower bound)"] += n
            continue
        heappush(heap, (lb, len(heap), vi, g, cap, None))
    tally.considered += sum(tally.pruned.values())
    return heap


def _expand(ev: Evaluation, heap: list, vi: int, g, cap: float, seen: set) -> None:
    """Bound each leaf of a popped group and queue the promising ones (and its batch-shares twin)."""
    space, cache, tally = ev.space, ev.cache, ev.tally
    var = space.variants[vi]
    for sched, vpp in g.pipelines:
        plan = leaf_plan(g.base._replace(schedule=sched, vpp=vpp), space.request)
        lb = prune.leaf_bound(space, cache, var, plan, cap)
        if lb is None:
            tally.pruned["memory (lower bound)"] += 1
            continue
        heappush(heap, (lb, len(heap) + 1_000_000_000, vi, g, cap, plan))
        shared = cache.shares_plan(var, plan)
        if shared is None or shared in seen:
            continue
        seen.add(shared)
        lb = prune.shares_bound(space, cache, var, shared, cap)
        if lb is None:
            tally.pruned["memory (lower bound)"] += 1
            continue
        tally.considered += 1
        heappush(heap, (lb, len(heap) + 1_000_000_000, vi, g, cap, shared))


def _leanest(ev: Evaluation) -> RankedPlan | None:
    """The most memory-lean plan for the nothing-fits report: the leanest evaluated, else the leanest leaf under
    full recompute (evaluated now, if the stack offers it)."""
    tally = ev.tally
    if tally.leanest is not None:
        return tally.leanest[1]
    if tally.lean_leaf is None:
        return None
    _, var, plan = tally.lean_leaf
    full = plan.with_(recompute="full")
    if stack_violations(full, ev.space.request.framework):
        full = plan
    return evaluate(ev, var, full)
