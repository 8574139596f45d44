"""Ranking the survivors of a search: order by the objective, re-estimate the top with the event simulator, and
the nothing-fits report when no plan fits."""

from __future__ import annotations

import time
from dataclasses import replace

from meshplan.cost.estimate import estimate
from meshplan.cost.result import pareto_front
from meshplan.errors import MeshplanError
from meshplan.search.result import RankedPlan, SearchResult
from meshplan.search.state import SearchSpace, Tally
from meshplan.spec.model import ModelSpec

MAX_SIM_ACTIONS = 400_000
"""Plans whose schedule has more actions than this keep the closed-form pipeline time."""


def _simulated(model: ModelSpec, rp: RankedPlan, stack, calib) -> RankedPlan:
    """Re-estimate with the event simulator as the pipeline (meshplan.sim)."""
    from dataclasses import replace

    from meshplan.sim.adapter import simulated_pipeline

    p = rp.plan
    if p.pp == 1 or p.pp * p.vpp * p.n_micro * 3 > MAX_SIM_ACTIONS:
        return rp
    try:
        return replace(rp, simulated=estimate(model, rp.cluster, p, stack=stack, calib=calib,
                                              pipeline=simulated_pipeline()))
    except MeshplanError:
        return rp


def finish(space: SearchSpace, tally: Tally, fitting: list[RankedPlan], *, t0: float,
           lean: RankedPlan | None = None) -> SearchResult:
    """Rank the fitting plans and simulate the top, or build the nothing-fits report from the leanest plan
    (``t0``: the search's start, from ``time.perf_counter``)."""
    from meshplan.search.infeasible import nothing_fits

    req = space.request
    top = sorted(fitting, key=lambda rp: space.key(rp.cluster, rp.estimate.step_time, rp.plan))[: req.top]
    if req.simulate:
        top = [_simulated(space.model, rp, req.framework, space.calib) for rp in top]
        top.sort(key=lambda rp: space.key(rp.cluster, rp.step_time, rp.plan))
    infeasible = None
    if not top:
        infeasible = nothing_fits(space, tally, lean)
    front = pareto(space, fitting, top) if top and req.front else []
    # A front member simulated faster than a table row takes its place: one time per plan, one ranking.
    ranked = {(id(rp.cluster), rp.plan) for rp in top}
    top = sorted(top + [rp for rp in front if (id(rp.cluster), rp.plan) not in ranked],
                 key=lambda rp: space.key(rp.cluster, rp.step_time, rp.plan))[: req.top]
    return SearchResult(model=space.model, cluster=space.cluster, request=req, plans=tuple(top),
                        fitting=tuple(fitting), front=tuple(front), considered=tally.considered,
                        pruned=dict(tally.pruned), evaluated=tally.evaluated,
                        search_time_s=time.perf_counter() - t0, infeasible=infeasible, lean=lean if not top else None)


def pareto(space: SearchSpace, fitting: list[RankedPlan], top: list[RankedPlan]) -> list[RankedPlan]:
    """The time/memory Pareto front of the fitting plans, fastest first, every member timed as the table times
    plans (simulated when the search simulates): the front by the best time known is found, its unsimulated
    members are simulated, and the front is taken again until no member changes, so it holds the winner and
    no plan on it is timed by another model than the table."""
    req = space.request
    known = {(id(rp.cluster), rp.plan): rp for rp in top}
    plans = [known.get((id(rp.cluster), rp.plan), rp) for rp in fitting]
    while True:  # each round simulates at least one more plan, so it ends
        idx = pareto_front([(rp.step_time, rp.best.peak_memory) for rp in plans])
        fresh = [i for i in idx if req.simulate and plans[i].simulated is None and plans[i].plan.pp > 1]
        if not fresh:
            break
        for i in fresh:
            plans[i] = _simulated(space.model, plans[i], req.framework, space.calib)
            if plans[i].simulated is None:  # too long to simulate: keeps its closed form
                plans[i] = replace(plans[i], simulated=plans[i].estimate)
    return [plans[i] for i in pareto_front([(rp.step_time, rp.best.peak_memory) for rp in plans])]
