"""Nothing fits: the most memory-lean plan's per-GPU breakdown against capacity, and the smallest number of the
same GPUs on which the job fits (found with the memory bound, confirmed by the full cost model)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from meshplan.cost.estimate import estimate
from meshplan.cost.memory import GiB
from meshplan.errors import Infeasible, MeshplanError
from meshplan.search.bounds import layer_table, memory_lower_bound
from meshplan.search.result import RankedPlan
from meshplan.search.space import degree_tuples, leaf_plan, leaves
from meshplan.search.state import SearchSpace, Tally
from meshplan.spec.cluster import ClusterSpec, Derating

MAX_SCALE = 64
"""Search for a fitting size up to 64x the given GPUs."""
CONFIRM = 6
"""Leanest leaves (by the bound) confirmed with the full cost model at each size."""


def _breakdown(rp: RankedPlan) -> str:
    m, cap = rp.estimate.memory, rp.estimate.capacity
    parts = ", ".join(f"{k} {v / GiB:.1f}" for k, v in m.as_dict().items() if v > 0)
    return f"{m.total() / GiB:.1f} GiB per GPU ({parts}) against {cap / GiB:.1f} GiB"


def _fits_on(model, cluster: ClusterSpec, req) -> bool:
    """Some plan fits ``cluster`` under full recompute (the leanest options first)."""
    pruned, scored, tables = Counter(), [], {}
    node = min(p.gpus_per_node for p in cluster.pools)
    cap = req.max_memory_fraction * min(p.gpu.hbm_bytes for p in cluster.pools)
    lean = replace(req, pins={**req.pins, "micro_batch": 1}) if "micro_batch" not in req.pins else req
    for deg in degree_tuples(model, cluster, lean, pruned):
        for leaf in leaves(model, deg, lean, node=node, pruned=pruned):
            if leaf.schedule not in ("", "1f1b"):
                continue
            plan = leaf_plan(leaf, lean, recompute="full")
            key = (plan.tp, plan.cp, plan.ep, plan.etp, plan.cp_kind)
            if key not in tables:
                tables[key] = layer_table(model, cluster.pools[0], plan, stack=req.framework)
            scored.append((memory_lower_bound(tables[key], plan), len(scored), plan))
    for mem, _, plan in sorted(scored)[:CONFIRM]:
        if mem > cap:
            return False
        try:
            est = estimate(model, cluster, plan, stack=req.framework)
        except MeshplanError:
            continue
        if est.peak_memory <= cap:
            return True
    return False


def min_gpus(model, cluster: ClusterSpec, req) -> int:
    """Smallest multiple of a node of the cluster's (first pool's) GPUs on which some plan fits; 0 if none up
    to MAX_SCALE times the cluster."""
    pool = cluster.pools[0]
    step = pool.gpus_per_node
    n = max(step, cluster.n_gpus)
    while n <= MAX_SCALE * max(cluster.n_gpus, step):
        trial = replace(cluster, pools=(replace(pool, n_gpus=n),), name="", derating=Derating())
        if _fits_on(model, trial, req):
            return n
        n = n + step if n < 4 * cluster.n_gpus else n * 2
    return 0


def nothing_fits(space: SearchSpace, tally: Tally, lean: RankedPlan | None) -> Infeasible:
    """The typed infeasible result of a search that found no fitting plan, from its tally and its most
    memory-lean plan (None when no leaf was even bounded)."""
    req = space.request
    if lean is None and tally.lean_leaf is None and req.pins:
        # No valid layout at all: the pins themselves are impossible here (divisibility), not the memory.
        pins = ", ".join(f"{k}={v}" for k, v in sorted(req.pins.items()))
        reason = (f"no valid layout with the pinned {pins} for {space.model.name} on {space.cluster.describe()} "
                  "(degrees must divide the GPU count, heads, layers and batch); unpin or change them")
        return Infeasible(kind="pins", reason=reason, details={"pins": dict(req.pins)})
    need = min_gpus(space.model, space.cluster, req)
    where = f"{need}x{space.cluster.pools[0].gpu.name}" if need else f"none up to {MAX_SCALE}x these GPUs"
    reason = f"no plan fits under {100 * req.max_memory_fraction:.0f} % of device memory"
    if lean is not None:
        reason += f"; the leanest needs {_breakdown(lean)}"
    reason += f"; smallest cluster that fits: {where}"
    details = {"min_gpus": need, "memory_fraction": req.max_memory_fraction}
    if lean is not None:
        details.update(lean_plan=lean.plan.to_dict(), lean_memory_bytes=lean.estimate.memory.as_dict(),
                       capacity_bytes=lean.estimate.capacity)
    return Infeasible(kind="memory", reason=reason, details=details)
