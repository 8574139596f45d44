"""Ranking the survivors of a search: order by the objective, re-estimate the top with the event simulator, and
the nothing-fits report when no plan fits."""

from __future__ import annotations

import time

from meshplan.cost.estimate import estimate
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
    top = sorted(fitting, key=lambda rp: space.key(rp.cluster, rp.estimate.step_time))[: req.top]
    if req.simulate:
        top = [_simulated(space.model, rp, req.framework, space.calib) for rp in top]
        top.sort(key=lambda rp: space.key(rp.cluster, rp.step_time))
    infeasible = None
    if not top:
        infeasible = nothing_fits(space, tally, lean)
    return SearchResult(model=space.model, cluster=space.cluster, request=req, plans=tuple(top),
                        fitting=tuple(fitting), considered=tally.considered,
                        pruned=dict(tally.pruned), evaluated=tally.evaluated,
                        search_time_s=time.perf_counter() - t0, infeasible=infeasible, lean=lean if not top else None)
