"""The state of one search, in three parts with one job each: the frozen ``SearchSpace`` (what is searched: the
model, the cluster's variants, the request), the ``CostCache`` (per-layer costs and other memoized pieces shared
by many leaves) and the ``Tally`` (what was considered, pruned and evaluated). Bounds (``prune``) and the driver
take them explicitly; none of them calls back into the driver."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from meshplan.cost.bands import least_pessimism, pessimism
from meshplan.cost.estimate import rank_pool
from meshplan.search.bounds import LayerTable, layer_table, p2p_factor, p2p_send_time
from meshplan.search.hetero import cluster_variants, in_cluster_order
from meshplan.search.request import SearchRequest
from meshplan.search.result import RankedPlan
from meshplan.search.shares import shares_leaf, shares_template
from meshplan.search.space import degree_tuples, groups
from meshplan.spec.cluster import ClusterSpec, Pool
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import Plan


def dollars_per_hour(cluster: ClusterSpec, prices: dict) -> float:
    """Price of all GPUs of ``cluster`` per hour: the request's prices, else the catalog's (0 = unknown)."""
    return sum(p.n_gpus * float(prices.get(p.gpu.name, p.gpu.price_per_hour)) for p in cluster.pools)


def pool_key(pool: Pool) -> tuple:
    """What per-layer costs and pipeline sends read of a pool (``layer_table``, ``p2p_send_time``): its GPU and its
    network levels (``group_link``). The outermost level's span only bounds the groups that cross it, so pools that
    differ in size beyond their scale-up domain (the smaller worlds of one search) cost alike and share tables."""
    levels = pool.network()
    if len(levels) == 1:
        return pool.gpu, pool.gpus_per_node, levels
    out = levels[-1]
    return pool.gpu, pool.gpus_per_node, levels[:-1], (out.name, out.bandwidth, out.latency)


def layer_key(plan: Plan) -> tuple:
    """What per-layer costs depend on besides the pool and the stack (fixed for a search)."""
    return plan.tp, plan.cp, plan.micro_batch, plan.cp_kind, plan.ep, plan.etp, plan.sp, plan.rank_order


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """What one search ranges over. ``variants`` are the sub-clusters planned on (the cluster itself, or every
    ordered subset of a mixed cluster's pools); ``shares`` are those that get uneven batch-share candidates (one
    order per subset of pools, the cluster's own)."""

    model: ModelSpec
    """The model."""
    cluster: ClusterSpec
    """The cluster as given."""
    request: SearchRequest
    """Workload, limits, objective, pins and software stack."""
    calib: dict | None
    """Calibration table (None = the packaged one)."""
    variants: tuple[ClusterSpec, ...]
    """Sub-clusters to plan on."""
    shares: tuple[ClusterSpec, ...]
    """Variants that get uneven batch-share candidates."""

    @staticmethod
    def of(model: ModelSpec, cluster: ClusterSpec, request: SearchRequest, calib=None) -> "SearchSpace":
        """The space of ``request`` for ``model`` on ``cluster``."""
        variants = tuple(cluster_variants(cluster, precision=request.precision,
                                          allow_idle=request.allow_idle_pools, worlds=request.worlds))
        shares = tuple(v for v in variants if len(v.pools) > 1 and in_cluster_order(v, cluster))
        return SearchSpace(model=model, cluster=cluster, request=request, calib=calib, variants=variants,
                           shares=shares)

    def groups(self, pruned: Counter):
        """(variant index, group, capacity) for every group of every variant, options left out counted in
        ``pruned``."""
        for vi, var in enumerate(self.variants):
            node = min(p.gpus_per_node for p in var.pools)
            cap = max(self.request.max_memory_fraction * p.gpu.hbm_bytes for p in var.pools)
            for deg in degree_tuples(self.model, var, self.request, pruned):
                for g in groups(self.model, deg, self.request, node=node, pruned=pruned):
                    yield vi, g, cap

    def limits(self, variant: ClusterSpec, plan: Plan) -> list[float]:
        """Memory limit of each pipeline rank (bytes)."""
        frac = self.request.max_memory_fraction
        return [frac * rank_pool(variant, plan, r).gpu.hbm_bytes for r in range(plan.pp)]

    def key(self, variant: ClusterSpec, step: float, plan: Plan | None = None) -> float:
        """Objective: step time, currency per token for the cost objective, or for the robust objective the
        slow end of the plan's 80 % error band (``cost.bands``; without a plan, as for a bound, the least
        pessimistic band of any layout, so the key stays a lower bound)."""
        req = self.request
        if req.objective == "cost":
            return step * dollars_per_hour(variant, req.prices) / (req.global_batch * req.seq_len)
        if req.objective == "robust":
            return step * (pessimism(self.model, variant, plan) if plan is not None else least_pessimism())
        return step

    def has_shares(self, variant: ClusterSpec) -> bool:
        """The variant gets uneven batch-share candidates."""
        return any(v is variant for v in self.shares)

    def selective_allowed(self) -> bool:
        """Selective recompute is among the choices: not pinned away, and the stack offers it."""
        return self.request.pins.get("recompute") in (None, "selective") and \
            "selective" in self.request.framework.recompute_modes


@dataclass(kw_only=True)
class CostCache:
    """Memoized costs of one search: per-layer tables per (pool, intra-layer layout), pipeline send times, mixed-pool
    floors and batch shares, keyed so every leaf that shares them reuses them."""

    space: SearchSpace
    """The space the costs belong to."""
    tables: dict = field(default_factory=dict)
    sends: dict = field(default_factory=dict)
    floors: dict = field(default_factory=dict)
    shares: dict = field(default_factory=dict)
    pools: dict = field(default_factory=dict)
    """id(pool) -> (pool, index of its ``pool_key``): the pool is held so its id is not reused by a later (derated)
    one, and the small index keeps the table keys cheap to hash."""
    pool_keys: dict = field(default_factory=dict)

    def _pool(self, pool: Pool) -> int:
        hit = self.pools.get(id(pool))
        if hit is None:
            index = self.pool_keys.setdefault(pool_key(pool), len(self.pool_keys))
            hit = self.pools[id(pool)] = (pool, index)
        return hit[1]

    def table(self, pool, plan: Plan) -> LayerTable:
        """Per-layer costs, shared by every leaf with the same pool (by ``pool_key``) and intra-layer layout."""
        key = (self._pool(pool), *layer_key(plan))
        if key not in self.tables:
            sp = self.space
            self.tables[key] = layer_table(sp.model, pool, plan, stack=sp.request.framework, calib=sp.calib)
        return self.tables[key]

    def fastest(self, variant: ClusterSpec, plan: Plan) -> LayerTable:
        """Per-layer costs on the variant's fastest pool (a bound for every rank)."""
        return min((self.table(p, plan) for p in variant.pools), key=lambda t: t.work)

    def p2p(self, variant: ClusterSpec, plan: Plan) -> float:
        """Exposed pipeline sends of the smallest activation on the variant's cheapest pool (s)."""
        if plan.pp == 1:
            return 0.0
        sends = []
        for p in variant.pools:
            key = (self._pool(p), layer_key(plan), plan.stride("pp"))
            if key not in self.sends:
                self.sends[key] = p2p_send_time(self.space.model, p, plan, calib=self.space.calib)
            sends.append(self.sends[key])
        return min(sends) * p2p_factor(plan.schedule_name, pp=plan.pp, vpp=plan.vpp, n_micro=plan.n_micro)

    def shares_base(self, variant: ClusterSpec, plan: Plan) -> tuple[Plan, tuple[int, ...]] | None:
        """The leaf's dp-outermost layout and replicas per pool, where uneven shares apply."""
        if not self.space.has_shares(variant):
            return None
        return shares_template(self.space.model, variant, plan, pins=self.space.request.pins)

    def shares_plan(self, variant: ClusterSpec, plan: Plan) -> Plan | None:
        """The leaf with shares sized to its pools (``shares_leaf``), memoized per layout and pipeline."""
        tpl = self.shares_base(variant, plan)
        if tpl is None:
            return None
        key = (id(variant), layer_key(plan), plan.schedule_name, plan.pp, plan.vpp)
        return shares_leaf(tpl, [self.table(p, plan) for p in variant.pools], plan, memo=self.shares, key=key)


@dataclass(kw_only=True)
class Tally:
    """Counts of one search and the most memory-lean candidates (for the nothing-fits report)."""

    pruned: Counter = field(default_factory=Counter)
    """Candidates discarded, by reason."""
    considered: int = 0
    """Candidates enumerated."""
    evaluated: int = 0
    """Full cost-model evaluations."""
    leanest: tuple[float, RankedPlan] | None = None
    """The evaluated plan with the lowest peak memory relative to its limit."""
    lean_leaf: tuple[float, ClusterSpec, Plan] | None = None
    """The leaf with the lowest static memory bound relative to the capacity (never evaluated if pruned)."""

    def note_leaf(self, ratio: float, variant: ClusterSpec, plan: Plan) -> None:
        """Remember a leaf's static memory share if it is the leanest so far."""
        if self.lean_leaf is None or ratio < self.lean_leaf[0]:
            self.lean_leaf = (ratio, variant, plan)

    def note_plan(self, ratio: float, rp: RankedPlan) -> None:
        """Remember an evaluated plan if it is the leanest so far."""
        if self.leanest is None or ratio < self.leanest[0]:
            self.leanest = (ratio, rp)
