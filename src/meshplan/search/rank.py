"""Ranking the survivors of a search: order by the objective, re-estimate the top with the event simulator,
the time/memory Pareto front, and the nothing-fits report when no plan fits."""

from __future__ import annotations

import math
import time

from meshplan.cost.estimate import estimate
from meshplan.errors import MeshplanError
from meshplan.search.result import RankedPlan, SearchResult
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


def pareto_front(plans: list[RankedPlan]) -> list[RankedPlan]:
    """Plans not beaten on both step time and peak memory, fastest first."""
    out, low = [], math.inf
    for rp in sorted(plans, key=lambda r: (r.estimate.step_time, r.estimate.peak_memory)):
        if rp.estimate.peak_memory < low:
            out.append(rp)
            low = rp.estimate.peak_memory
    return out


def finish(run, t0: float) -> SearchResult:
    """Rank, simulate the top, build the Pareto front and the nothing-fits report (``run``: the driver's
    search state; ``t0``: its start, from ``time.perf_counter``)."""
    from meshplan.search.infeasible import nothing_fits

    req = run.req
    keyed = sorted(run.fitting, key=lambda rp: (run.key(run.variants.index(rp.cluster), rp.estimate.step_time)))
    top = keyed[: req.top]
    if req.simulate:
        top = [_simulated(run.model, rp, req.framework, run.calib) for rp in top]
        top.sort(key=lambda rp: run.key(run.variants.index(rp.cluster), rp.step_time))
    infeasible, lean = (None, None)
    if not top:
        infeasible, lean = nothing_fits(run)
    return SearchResult(model=run.model, cluster=run.cluster, request=req, plans=tuple(top),
                        pareto=tuple(pareto_front(run.fitting)), considered=run.considered,
                        pruned=dict(run.pruned), evaluated=run.n_eval, search_time_s=time.perf_counter() - t0,
                        infeasible=infeasible, lean=lean)
