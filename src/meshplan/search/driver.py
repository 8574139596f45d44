"""The search driver: enumerate leaves, bound them, evaluate survivors best-bound-first with the full cost model
(picking the least recompute that fits), refine the best with the layer-partition kernel and other rank orders,
and re-rank the top with the event simulator. The numeric kernels live in ``bounds`` and ``partition``."""

from __future__ import annotations

import math
import time
from bisect import insort
from collections import Counter
from heapq import heappop, heappush
from typing import Callable

from meshplan.cost.estimate import estimate, rank_pool
from meshplan.cost.pipeline import stage_rank
from meshplan.errors import MeshplanError
from meshplan.search.bounds import (
    LayerTable,
    dp_exact,
    group_pipeline_floor,
    group_time_bound,
    layer_table,
    mixed_pipeline_floor,
    mixed_schedule_bound,
    p2p_factor,
    p2p_send_time,
    recompute_extra,
    static_lower_bound,
    time_lower_bound,
)
from meshplan.search.even import even_pipeline_bound, even_split_work
from meshplan.search.hetero import cluster_variants, in_cluster_order
from meshplan.search.rank import finish
from meshplan.search.request import SearchRequest
from meshplan.search.result import RankedPlan, SearchResult
from meshplan.search.shares import (
    replica_floor,
    shares_floor,
    shares_leaf,
    shares_template,
)
from meshplan.search.space import degree_tuples, groups, leaf_plan
from meshplan.search.split import balanced_split
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import DEFAULT_RANK_ORDER, Plan
from meshplan.spec.schedules import schedule_spec

RANK_ORDERS = (DEFAULT_RANK_ORDER, "tp-cp-ep-pp-dp", "tp-dp-cp-ep-pp")
"""Rank orders tried on the best plans: Megatron's default, pipeline inside data parallel (pipeline sends on
the fast links), and cp outside dp (cp's ring across nodes, dp's traffic inside)."""


def dollars_per_hour(cluster: ClusterSpec, prices: dict) -> float:
    """Price of all GPUs of ``cluster`` per hour: the request's prices, else the catalog's (0 = unknown)."""
    return sum(p.n_gpus * float(prices.get(p.gpu.name, p.gpu.price_per_hour)) for p in cluster.pools)


class _Run:
    """State of one search: the request, the cluster variants, caches and counters."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, req: SearchRequest, calib):
        self.model, self.cluster, self.req, self.calib = model, cluster, req, calib
        self.variants = cluster_variants(cluster, precision=req.precision, allow_idle=req.allow_idle_pools)
        self.pruned: Counter = Counter()
        self.tables: dict[tuple, LayerTable] = {}
        self.fitting: list[RankedPlan] = []
        self.keys: list[float] = []
        self.n_eval = 0
        self.considered = 0
        self.leanest: tuple[float, RankedPlan] | None = None
        self.lean_leaf: tuple[float, int, Plan] | None = None
        # Shares plans are built once per variant with pools in cluster order (the order does not matter to them).
        self.share_variants = {vi for vi, v in enumerate(self.variants)
                               if len(v.pools) > 1 and in_cluster_order(v, cluster)}
        self.shares_seen: set[Plan] = set()
        self.shares_memo: dict[tuple, tuple[int, ...] | None] = {}
        self.sends: dict[tuple, float] = {}
        self.floors: dict[tuple, float] = {}

    # -- costs -------------------------------------------------------------------------------------------
    @staticmethod
    def layer_key(plan: Plan) -> tuple:
        """What per-layer costs depend on besides the pool."""
        return (plan.tp, plan.cp, plan.micro_batch, plan.cp_kind, plan.ep, plan.etp, plan.sp, plan.rank_order)

    def table(self, pool, plan: Plan) -> LayerTable:
        """Per-layer costs, shared by every leaf with the same pool and intra-layer layout."""
        key = (id(pool), *self.layer_key(plan))
        if key not in self.tables:
            self.tables[key] = layer_table(self.model, pool, plan, stack=self.req.framework, calib=self.calib)
        return self.tables[key]

    def limits(self, vi: int, plan: Plan) -> list[float]:
        """Memory limit of each pipeline rank (bytes)."""
        var = self.variants[vi]
        return [self.req.max_memory_fraction * rank_pool(var, plan, r).gpu.hbm_bytes for r in range(plan.pp)]

    def over(self, vi: int, rp: RankedPlan) -> float:
        """Bytes by which the tightest rank exceeds its memory limit (<= 0: fits). Shares plans: the estimate
        reports the pool with the highest peak relative to its device memory."""
        est = rp.estimate
        if rp.plan.batch_shares:
            return est.peak_memory - self.req.max_memory_fraction * est.capacity
        return max(m.total() - lim for m, lim in zip(est.memory_per_stage, self.limits(vi, rp.plan)))

    def key(self, vi: int, step: float) -> float:
        """Objective: step time, or currency per token for the cost objective."""
        if self.req.objective == "cost":
            return step * dollars_per_hour(self.variants[vi], self.req.prices) / \
                (self.req.global_batch * self.req.seq_len)
        return step

    def bound(self) -> float:
        """Objective of the best fitting plan so far (inf until there is one): the bound prunes against the
        optimum only; runners-up are the best of what was evaluated."""
        return self.keys[0] if self.keys else math.inf

    def selective_allowed(self) -> bool:
        """Selective recompute is among the choices: not pinned away, and the stack offers it."""
        return self.req.pins.get("recompute") in (None, "selective") and \
            "selective" in self.req.framework.recompute_modes

    # -- enumeration and bounds --------------------------------------------------------------------------
    def groups(self):
        """(variant, group, capacity) for every group of every cluster variant."""
        for vi, var in enumerate(self.variants):
            node = min(p.gpus_per_node for p in var.pools)
            cap = max(self.req.max_memory_fraction * p.gpu.hbm_bytes for p in var.pools)
            for deg in degree_tuples(self.model, var, self.req, self.pruned):
                for g in groups(self.model, deg, self.req, node=node, pruned=self.pruned):
                    yield vi, g, cap

    def fastest(self, vi: int, plan: Plan) -> LayerTable:
        """Per-layer costs on the variant's fastest pool (a bound for every rank)."""
        return min((self.table(p, plan) for p in self.variants[vi].pools), key=lambda t: t.work)

    def group_bound(self, vi: int, plan: Plan, cap: float, pipelines=()) -> float | None:
        """Bound of every leaf of a group (``plan`` is its 1F1B member): the least over its ``pipelines`` of the
        pipeline bound with the recompute memory forces (``group_pipeline_floor``), the mixed-pool or shares
        floor, the optimizer and overhead; None when the static memory alone cannot fit, or no schedule of the
        group fits under full recompute."""
        fast = self.fastest(vi, plan)
        mem = static_lower_bound(fast, plan)
        if self.lean_leaf is None or mem / cap < self.lean_leaf[0]:
            self.lean_leaf = (mem / cap, vi, plan)
        if mem > cap and not self.req.exhaustive:
            return None
        pipe = 0.0
        if pipelines and not self.req.exhaustive:
            pipe = group_pipeline_floor(fast, plan, pipelines, limit=cap, selective=self.selective_allowed())
            if pipe is None:
                return None
        # The group's leaves hold the head on the last rank (looped) or on rank 0 (V-shaped): the lower floor.
        heads = {plan.pp - 1} | ({0} if any(schedule_spec(sched).placement == "v" for sched, _ in pipelines if sched)
                                 else set())
        floor = min(self.mixed_floor(vi, plan, head_rank=h) for h in heads)
        tpl = self.shares_base(vi, plan)
        if tpl is not None:
            reps, works = tpl[1], tuple(self.table(p, plan).work for p in self.variants[vi].pools)
            floor = min(floor, shares_floor(reps, works, total=plan.global_batch // plan.micro_batch, pp=plan.pp))
        return self.key(vi, max(group_time_bound(fast, plan), max(pipe, floor) + group_time_bound(fast, plan, m=0)))

    def shares_base(self, vi: int, plan: Plan) -> tuple[Plan, tuple[int, ...]] | None:
        """The leaf's dp-outermost layout and replicas per pool, where uneven shares apply."""
        if vi not in self.share_variants:
            return None
        return shares_template(self.model, self.variants[vi], plan, pins=self.req.pins)

    def shares_plan(self, vi: int, plan: Plan) -> Plan | None:
        """The leaf with shares sized to its pools (``shares_leaf``), memoized per layout and pipeline."""
        tpl = self.shares_base(vi, plan)
        if tpl is None:
            return None
        key = (vi, self.layer_key(plan), plan.schedule_name, plan.pp, plan.vpp)
        return shares_leaf(tpl, [self.table(p, plan) for p in self.variants[vi].pools], plan,
                           memo=self.shares_memo, key=key)

    def shares_bound(self, vi: int, plan: Plan, cap: float) -> float | None:
        """Objective lower bound of a shares plan: the leaf bound on the fastest pool (no p2p: the slowest
        replica's sends are not known; no data-parallel term), raised to the slowest pool's pipeline bound for
        its share (``replica_floor``)."""
        fast = self.fastest(vi, plan)
        extra = recompute_extra(fast, plan, limit=cap, selective=self.selective_allowed())
        if extra is None and not self.req.exhaustive:
            return None
        floor = max(replica_floor(self.table(p, plan), plan, s) for p, s in zip(self.variants[vi].pools,
                                                                                 plan.batch_shares))
        return self.key(vi, time_lower_bound(fast, plan, extra_work=extra or 0.0, pipe_floor=floor))

    def mixed_floor(self, vi: int, plan: Plan, *, head_rank: int | None = None, fill: bool = False) -> float:
        """Mixed pools: ``mixed_pipeline_floor`` of the ranks' layer work on their pools (the fastest pool's, times
        the smallest per-block slowdown of the rank's pool), the head on the rank that holds the last stage, and
        at least vpp layers per rank (every split search evaluates gives each virtual stage a layer); m of them
        bound the step (s). With ``fill``, the plan's schedule adds its fill (``mixed_schedule_bound``, every
        layer at its fastest pool's pace). 0 on one pool."""
        var = self.variants[vi]
        if var.homogeneous:
            return 0.0
        if head_rank is None:
            head_rank = stage_rank(plan.schedule_name, stage=plan.n_stages - 1, pp=plan.pp)
        # Pools of pipeline ranks depend on n_gpus, pp and the rank order (in the layer key) only.
        key = (vi, self.layer_key(plan), plan.pp, plan.vpp, head_rank)
        if key not in self.floors:
            ref = self.fastest(vi, plan)
            ref_layers = ref.work - ref.head
            layers, heads, least = [], [], []
            for r in range(plan.pp):
                t = self.table(rank_pool(var, plan, r), plan)
                # Blocks may slow down by different factors on another GPU: the smallest bounds every split.
                ratio = min(b.work / max(a.work, 1e-30) for b, a in zip(t.blocks, ref.blocks))
                layers.append(ratio * ref_layers)
                heads.append(t.head if r == head_rank else 0.0)
                least.append(plan.vpp * min(b.work for b in t.blocks))
            tabs = [self.table(p, plan) for p in var.pools]
            total = sum(min(t.blocks[i].work for t in tabs) * b.n_layers for i, b in enumerate(ref.blocks)) + \
                min(t.head for t in tabs)
            self.floors[key] = (mixed_pipeline_floor(layers, heads, least), total)
        busiest, total = self.floors[key]
        if not fill:
            return plan.n_micro * busiest
        return mixed_schedule_bound(plan.schedule_name, pp=plan.pp, vpp=plan.vpp, n_micro=plan.n_micro,
                                    share=self.fastest(vi, plan).share, busiest=busiest, total=total)

    def p2p(self, vi: int, plan: Plan) -> float:
        """``p2p_lower_bound`` on the variant's cheapest pool, the send time cached per layout."""
        if plan.pp == 1:
            return 0.0
        sends = []
        for p in self.variants[vi].pools:
            key = (id(p), self.layer_key(plan), plan.stride("pp"))
            if key not in self.sends:
                self.sends[key] = p2p_send_time(self.model, p, plan, calib=self.calib)
            sends.append(self.sends[key])
        return min(sends) * p2p_factor(plan.schedule_name, pp=plan.pp, vpp=plan.vpp, n_micro=plan.n_micro)

    def leaf_bound(self, vi: int, plan: Plan, cap: float) -> float | None:
        """Objective lower bound of a leaf, or None when it cannot fit even with full recompute."""
        var = self.variants[vi]
        fast = self.fastest(vi, plan)
        extra = recompute_extra(fast, plan, limit=cap, selective=self.selective_allowed())
        if extra is None and not self.req.exhaustive:
            return None
        dp = dp_exact(fast, plan, pool=var.pools[0], calib=self.calib) if var.homogeneous else None
        p2p = self.p2p(vi, plan)
        floor = self.mixed_floor(vi, plan, fill=True)
        if var.homogeneous and plan.pp > 1 and not extra:
            # The main phase evaluates the even split on one pool: bound that split itself.
            even = even_split_work(self.model, fast, plan)
            floor = even_pipeline_bound(even, fast, plan, pool=var.pools[0], calib=self.calib)
        return self.key(vi, time_lower_bound(fast, plan, p2p=p2p, extra_work=extra or 0.0, dp=dp, pipe_floor=floor))

    # -- evaluation ----------------------------------------------------------------------------------------
    def split(self, vi: int, plan: Plan, *, force: bool = False) -> tuple[int, ...]:
        """Layer split: even on one pool (the published family), the kernel's on mixed pools or when forced."""
        var = self.variants[vi]
        if plan.pp == 1 or (var.homogeneous and not force) or plan.batch_shares:
            return ()
        tabs = [self.table(rank_pool(var, plan, r), plan) for r in range(plan.pp)]
        return balanced_split(self.model, plan, tables=tabs, limits=self.limits(vi, plan)) or ()

    def run(self, vi: int, plan: Plan) -> RankedPlan | None:
        """Full cost model on one plan."""
        self.n_eval += 1
        var = self.variants[vi]
        try:
            est = estimate(self.model, var, plan, stack=self.req.framework, calib=self.calib)
        except MeshplanError:
            self.pruned["invalid after split"] += 1
            return None
        rp = RankedPlan(plan=plan, cluster=var, estimate=est, dollars_per_hour=dollars_per_hour(var, self.req.prices))
        if plan.batch_shares:
            ratio = est.peak_memory / (self.req.max_memory_fraction * est.capacity)
        else:
            ratio = max(m.total() / lim for m, lim in zip(est.memory_per_stage, self.limits(vi, plan)))
        if self.leanest is None or ratio < self.leanest[0]:
            self.leanest = (ratio, rp)
        return rp

    def fits(self, vi: int, rp: RankedPlan) -> bool:
        """Every rank's peak within its pool's limit."""
        if rp.plan.batch_shares:
            return self.over(vi, rp) <= 0
        lims = self.limits(vi, rp.plan)
        return all(m.total() <= lim for m, lim in zip(rp.estimate.memory_per_stage, lims))

    def accept(self, vi: int, rp: RankedPlan) -> None:
        """Record a fitting plan."""
        self.fitting.append(rp)
        insort(self.keys, self.key(vi, rp.estimate.step_time))

    def with_recompute(self, vi: int, plan: Plan, mode: str, k: int = 0) -> RankedPlan | None:
        """The plan under a recompute mode, split re-balanced for it on mixed pools."""
        p = plan.with_(recompute=mode, recompute_layers=k, layer_split=())
        return self.run(vi, p.with_(layer_split=self.split(vi, p)))

    def ladder(self, vi: int, plan: Plan) -> None:
        """Least recompute that fits: none; else selective and full on the fewest layers per rank."""
        base = self.with_recompute(vi, plan, "none")
        if base is None:
            return
        if self.fits(vi, base):
            self.accept(vi, base)
            return
        if not self.req.exhaustive and self.key(vi, base.estimate.step_time) >= self.bound():
            self.pruned["bound (recompute only adds time)"] += 1
            return
        pin = self.req.pins.get("recompute")
        modes = self.req.framework.recompute_modes
        found = False
        if pin in (None, "selective") and "selective" in modes and any(b.layer.attention for b in self.model.blocks):
            sel = self.with_recompute(vi, plan, "selective")
            if sel is not None and self.fits(vi, sel):
                self.accept(vi, sel)
                found = True
        if pin not in (None, "full") or "full" not in modes:
            self.pruned["memory"] += 0 if found else 1
            return
        full = self.with_recompute(vi, plan, "full")
        if full is None or not self.fits(vi, full):
            self.pruned["memory"] += 0 if found else 1
            return
        self.partial_full(vi, plan, base, full)

    def partial_full(self, vi: int, plan: Plan, base: RankedPlan, full: RankedPlan) -> None:
        """Fewest fully recomputed layers per rank that fit, from a linear guess between none and all."""
        per_rank = max(sum(full.plan.layer_split[r::plan.pp]) for r in range(plan.pp)) if full.plan.layer_split \
            else -(-self.model.n_layers // plan.pp)
        over = self.over(vi, base)
        span = max(base.estimate.peak_memory - full.estimate.peak_memory, 1.0)
        k = max(1, math.ceil(over / span * per_rank))
        if "recompute_layers" in self.req.pins:
            k = self.req.pins["recompute_layers"] or per_rank
        while k < per_rank:
            rp = self.with_recompute(vi, plan, "full", k)
            if rp is not None and self.fits(vi, rp):
                self.accept(vi, rp)
                return
            k += max(1, per_rank // 16)
        self.accept(vi, full)

    # -- refinement ----------------------------------------------------------------------------------------
    def refine(self) -> None:
        """Try the partition kernel's split and other rank orders on the best distinct plans."""
        best = sorted(self.fitting, key=lambda rp: rp.estimate.step_time)[: 2 * self.req.top]
        for rp in best:
            vi = next(i for i, v in enumerate(self.variants) if v is rp.cluster)
            tries = []
            if rp.plan.pp > 1 and not rp.plan.layer_split:
                tries.append(rp.plan.with_(layer_split=self.split(vi, rp.plan, force=True)))
            if rp.cluster.homogeneous and "rank_order" not in self.req.pins:
                tries += [rp.plan.with_(rank_order=o) for o in RANK_ORDERS if o != rp.plan.rank_order]
            for p in tries:
                if p == rp.plan:
                    continue
                new = self.run(vi, p)
                if new is not None and self.fits(vi, new) and new.estimate.step_time < rp.estimate.step_time:
                    self.accept(vi, new)


def search(model: ModelSpec, cluster: ClusterSpec, request: SearchRequest, *, calib=None,
           progress: Callable[[int, int], None] | None = None) -> SearchResult:
    """Plan ``model`` on ``cluster`` for ``request``; see the module docstring for the steps.

    Args:
        calib: calibration table for the cost model (None = packaged).
        progress: optional ``f(done, total)`` called while candidates are evaluated.
    """
    t0 = time.perf_counter()
    run = _Run(model, cluster, request, calib)
    heap: list = []
    for vi, g, cap in run.groups():
        n = len(g.pipelines)
        run.considered += n
        plan = leaf_plan(g.base._replace(schedule="1f1b" if g.base.deg.pp > 1 else ""), request)
        lb = run.group_bound(vi, plan, cap, g.pipelines)
        if lb is None:
            run.pruned["memory (lower bound)"] += n
            continue
        heappush(heap, (lb, len(heap), vi, g, cap, None))
    run.considered += sum(run.pruned.values())
    done = 0
    while heap:
        lb, _, vi, g, cap, plan = heappop(heap)
        if not request.exhaustive and lb >= run.bound():
            run.pruned["bound"] += (1 if plan is not None else len(g.pipelines)) + \
                sum(1 if it[5] is not None else len(it[3].pipelines) for it in heap)
            break
        if plan is None:
            _expand(run, heap, vi, g, cap)
            continue
        run.ladder(vi, plan)
        done += 1
        if progress and done % 32 == 0:
            progress(done, done + len(heap))
    if not request.exhaustive:
        run.refine()
    return finish(run, t0)


def _expand(run: _Run, heap: list, vi: int, g, cap: float) -> None:
    """Bound each leaf of a popped group and queue the promising ones."""
    for sched, vpp in g.pipelines:
        plan = leaf_plan(g.base._replace(schedule=sched, vpp=vpp), run.req)
        lb = run.leaf_bound(vi, plan, cap)
        if lb is None:
            run.pruned["memory (lower bound)"] += 1
            continue
        heappush(heap, (lb, len(heap) + 1_000_000_000, vi, g, cap, plan))
        shared = run.shares_plan(vi, plan)
        if shared is None or shared in run.shares_seen:
            continue
        run.shares_seen.add(shared)
        lb = run.shares_bound(vi, shared, cap)
        if lb is None:
            run.pruned["memory (lower bound)"] += 1
            continue
        run.considered += 1
        heappush(heap, (lb, len(heap) + 1_000_000_000, vi, g, cap, shared))
