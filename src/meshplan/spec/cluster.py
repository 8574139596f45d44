"""Cluster spec: *where* a model is trained. Pools of GPUs and a hierarchy of network levels.

A process group of ``size`` ranks placed with ``stride`` consecutive ranks apart spans ``stride * size``
consecutive GPUs; the innermost network level that contains that span carries its traffic. Where a group
crosses scale-up domains, each domain's members drive their own NIC rail in parallel (NCCL's rail-aligned
rings), so the group's bus bandwidth is ``members_per_domain * nic_bandwidth``, capped by the scale-up link.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from numbers import Integral

from meshplan.errors import SpecError
from meshplan.spec.hardware import GPUSpec


def _whole(value: object, least: int) -> bool:
    """``value`` is an integer (not a bool) >= ``least``."""
    return isinstance(value, Integral) and not isinstance(value, bool) and value >= least


def _finite(value: float, *, positive: bool) -> bool:
    """``value`` is a finite number > 0 (``positive``) or >= 0; NaN compares False both ways."""
    return math.isfinite(value) and (value > 0 if positive else value >= 0)


@dataclass(frozen=True, kw_only=True)
class NetworkLevel:
    """One level of the network hierarchy."""

    name: str
    """``nvlink``, ``pcie`` (a node without NVLink), ``leaf``, ``spine``..."""
    span: int
    """GPUs reachable inside one group of this level (8 for an HGX NVLink domain)."""
    bandwidth: float
    """Per-GPU unidirectional bandwidth at this level (bytes/s)."""
    latency: float
    """Per-hop latency (s)."""

    def __post_init__(self) -> None:
        if not _whole(self.span, 1):
            raise SpecError(f"network.{self.name}.span", self.span, "must be a whole number >= 1")
        if not _finite(self.bandwidth, positive=True):
            raise SpecError(f"network.{self.name}.bandwidth", self.bandwidth, "must be positive and finite")
        if not _finite(self.latency, positive=False):
            raise SpecError(f"network.{self.name}.latency", self.latency, "must be >= 0 and finite")


@dataclass(frozen=True, kw_only=True)
class Pool:
    """Identical GPUs in identical nodes."""

    gpu: GPUSpec
    """The accelerator type."""
    n_gpus: int
    """GPUs in the pool."""
    gpus_per_node: int = 8
    """GPUs per host."""
    levels: tuple[NetworkLevel, ...] = ()
    """Network hierarchy inside this pool, innermost first; empty = derived from the GPU's datasheet."""

    def __post_init__(self) -> None:
        if not _whole(self.n_gpus, 1):
            raise SpecError(f"pool[{self.gpu.name}].n_gpus", self.n_gpus, "must be a whole number >= 1")
        if not _whole(self.gpus_per_node, 1):
            raise SpecError(f"pool[{self.gpu.name}].gpus_per_node", self.gpus_per_node, "must be a whole number >= 1")
        spans = [lv.span for lv in self.levels]
        if any(b <= a or b % a for a, b in zip(spans, spans[1:])):  # each level groups whole groups of the last
            raise SpecError(f"pool[{self.gpu.name}].levels", spans, "spans must grow from level to level, each a "
                            "multiple of the one inside it (e.g. 8 GPUs a node, then 64 a rail group)")

    def network(self) -> tuple[NetworkLevel, ...]:
        """The network levels, innermost first, ending with one that spans the whole pool."""
        if self.levels:
            return self.levels
        g = self.gpu
        domain = max(min(g.nvlink_domain, self.n_gpus), 1) if g.nvlink_domain >= self.gpus_per_node \
            else self.gpus_per_node
        # A GPU whose NVLink domain is smaller than its node (L40S, L4, H100 PCIe) reaches the node over PCIe
        link = "nvlink" if g.nvlink_domain >= self.gpus_per_node else "pcie"
        inner = NetworkLevel(name=link, span=domain, bandwidth=g.intra_bandwidth, latency=g.intra_latency)
        if self.n_gpus <= domain:
            return (inner,)
        return (inner, NetworkLevel(name="fabric", span=self.n_gpus, bandwidth=g.nic_bandwidth,
                                    latency=g.nic_latency))


@dataclass(frozen=True, kw_only=True)
class Derating:
    """Parts of a cluster running below their rating: a straggler GPU (thermal or power throttling, a failing
    HBM stack) and a degraded link (a NIC or cable retrained at a lower rate, a congested port). Synchronous
    training runs at the pace of the slowest member of every group, so each pipeline rank's pace is its slowest
    GPU's and its scale-out collectives run at its slowest link's (NCCL rings are bound by their slowest hop;
    RAPID-LLM prices faulty links the same way). GPU ids are global ranks in the cluster's order."""

    gpus: tuple[tuple[int, float], ...] = ()
    """(GPU id, fraction of its rated compute it delivers), e.g. ((17, 0.6),)."""
    links: tuple[tuple[int, float], ...] = ()
    """(scale-up domain index, fraction of its rated scale-out bandwidth), e.g. ((3, 0.25),) for node 3's NICs."""

    def __post_init__(self) -> None:
        for name, items in (("gpus", self.gpus), ("links", self.links)):
            for ident, frac in items:
                if not _whole(ident, 0):
                    raise SpecError(f"derating.{name}", ident, "ids must be integers >= 0")
                if not 0 < frac <= 1:
                    raise SpecError(f"derating.{name}[{ident}]", frac, "must be a fraction in (0, 1] of the rating")
            ids = [i for i, _ in items]
            twice = sorted({i for i in ids if ids.count(i) > 1})
            if twice:
                raise SpecError(f"derating.{name}", twice[0], "is derated twice; give each id once")

    def __bool__(self) -> bool:
        return bool(self.gpus or self.links)

    def compute(self, lo: int, hi: int, stride: int = 1) -> float:
        """Fraction of rated compute of the slowest GPU among ids ``range(lo, hi, stride)``."""
        return min((f for i, f in self.gpus if lo <= i < hi and (i - lo) % stride == 0), default=1.0)

    def link(self, domains: set[int]) -> float:
        """Fraction of rated scale-out bandwidth of the slowest link among these scale-up domains."""
        return min((f for d, f in self.links if d in domains), default=1.0)

    def dropped(self, n: int, w: int, domain: int) -> set[int]:
        """Scale-up domains idled when only ``w`` of the ``n`` GPUs run: the most derated whole domains first (a
        planner idles the slow parts)."""
        worst: dict[int, float] = {}
        for i, f in self.gpus:
            worst[i // domain] = min(worst.get(i // domain, 1.0), f)
        for d, f in self.links:
            worst[d] = min(worst.get(d, 1.0), f)
        return set(sorted(worst, key=lambda d: worst[d])[:(n - w) // domain])

    def renumbered(self, keep: list[int], domain: int) -> "Derating":
        """The derating of the GPUs ``keep`` (old ids, in their new order, renumbered 0..len-1)."""
        new = {g: i for i, g in enumerate(keep)}
        links: dict[int, float] = {}
        for d, f in self.links:
            for g in range(d * domain, (d + 1) * domain):
                if g in new:
                    links[new[g] // domain] = min(links.get(new[g] // domain, 1.0), f)
        return Derating(gpus=tuple((new[i], f) for i, f in self.gpus if i in new), links=tuple(sorted(links.items())))

    def idle(self, n: int, w: int, domain: int) -> "Derating":
        """The derating of the ``w`` GPUs that run when ``n - w`` idle (``dropped`` domains, then the last ids)."""
        drop = self.dropped(n, w, domain)
        return self.renumbered([g for g in range(n) if g // domain not in drop][:w], domain)


@lru_cache(maxsize=256)  # one object per derated pace, so the search's per-pool caches stay shared
def derated_pool(pool: Pool, *, compute: float, link: float) -> Pool:
    """``pool`` with its GPUs at ``compute`` of their rated FLOPs and its scale-out levels at ``link`` of their
    bandwidth (the scale-up level is inside the node and keeps its rating)."""
    if compute == 1.0 and link == 1.0:
        return pool
    g = pool.gpu
    peak = replace(g.peak, **{k: getattr(g.peak, k) * compute for k in ("fp32", "tf32", "bf16", "fp16", "fp8")})
    levels = pool.network()
    levels = levels[:1] + tuple(replace(lv, bandwidth=lv.bandwidth * link) for lv in levels[1:])
    return replace(pool, gpu=replace(g, peak=peak), levels=levels)


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """One or more pools. Homogeneous clusters have one pool."""

    pools: tuple[Pool, ...]
    """GPU pools; mixed-GPU clusters have several."""
    inter_pool_bandwidth: float = 0.0
    """Per-GPU bandwidth between pools (bytes/s); 0 means the slowest pool NIC."""
    name: str = ""
    """Optional label."""
    derating: Derating = Derating()
    """GPUs and links running below their rating (none by default)."""
    servers: int = 0
    """CPU machines on the same scale-out fabric that can run a parameter server's summation (BytePS keeps its
    servers on CPU-only machines: ``docs/rationale.md`` of bytedance/byteps 0.2.5); 0 = none."""
    server_bandwidth: float = 0.0
    """Scale-out bandwidth of one server machine, each direction (bytes/s); 0 = one NIC of the GPU's rate."""

    def __post_init__(self) -> None:
        if not self.pools:
            raise SpecError("cluster.pools", self.pools, "a cluster needs at least one pool")
        if not isinstance(self.servers, int) or isinstance(self.servers, bool) or self.servers < 0:
            raise SpecError("cluster.servers", self.servers, "must be a whole number of CPU machines >= 0")
        if not _finite(self.server_bandwidth, positive=False):
            raise SpecError("cluster.server_bandwidth", self.server_bandwidth, "must be >= 0 bytes/s (0 = one NIC)")
        if not _finite(self.inter_pool_bandwidth, positive=False):
            raise SpecError("cluster.inter_pool_bandwidth", self.inter_pool_bandwidth,
                            "must be >= 0 bytes/s (0 = the slowest pool's NIC)")
        if not isinstance(self.name, str):
            raise SpecError("cluster.name", self.name, "must be a string")
        if self.derating and not self.homogeneous:
            raise SpecError("derating", self.describe(), "is supported on a cluster of one GPU type so far")
        bad = [i for i, _ in self.derating.gpus if i >= self.n_gpus]
        if bad:
            raise SpecError("derating.gpus", bad[0], f"must be GPU ids of the cluster, 0..{self.n_gpus - 1}")
        domains = -(-self.n_gpus // self.pools[0].network()[0].span) if self.derating.links else 0
        bad = [d for d, _ in self.derating.links if d >= domains]
        if bad:
            raise SpecError("derating.links", bad[0], f"must be scale-up domain (node) ids of the cluster, "
                            f"0..{domains - 1}")

    @property
    def n_gpus(self) -> int:
        """All GPUs of all pools."""
        return sum(p.n_gpus for p in self.pools)

    @property
    def homogeneous(self) -> bool:
        """A single pool."""
        return len(self.pools) == 1

    @property
    def gpu(self) -> GPUSpec:
        """The GPU of a homogeneous cluster (the first pool's otherwise)."""
        return self.pools[0].gpu

    def describe(self) -> str:
        """Shorthand such as ``1024xa100-80gb`` or ``32xa100-80gb+32xh100-sxm``."""
        servers = [f"{self.servers}xserver" + (f"@{self.server_bandwidth / 1e9:g}" if self.server_bandwidth else "")] \
            if self.servers else []
        return "+".join([f"{p.n_gpus}x{p.gpu.name}" for p in self.pools] + servers)

    @property
    def server_capacity(self) -> float:
        """All server machines' scale-out bandwidth together, each direction (bytes/s)."""
        return self.servers * (self.server_bandwidth or self.pools[0].gpu.nic_bandwidth)


@dataclass(frozen=True, kw_only=True)
class GroupLink:
    """The effective link that one process group's collectives run on."""

    bandwidth: float
    """Bus bandwidth available to the collective per rank (bytes/s)."""
    latency: float
    """Per-step latency (s)."""
    level: str
    """Name of the outermost network level the group crosses."""
    machines: int = 1
    """Scale-up domains (GPU machines) the group spans."""


def group_link(pool: Pool, *, size: int, stride: int) -> GroupLink:
    """Effective link of a process group of ``size`` ranks ``stride`` apart inside ``pool``.

    Rail-aligned hierarchy (NCCL rings/trees over DGX/HGX, see NCCL docs on rail-optimized topologies): a group
    inside one scale-up domain uses that link; a group across domains sends over ``m`` NIC rails in parallel,
    ``m`` = its members per domain, capped by the scale-up bandwidth that feeds them.
    """
    levels = pool.network()
    if size <= 1:
        return GroupLink(bandwidth=levels[0].bandwidth, latency=0.0, level=levels[0].name)
    span = stride * size
    inner = levels[0]
    if span <= inner.span:
        return GroupLink(bandwidth=inner.bandwidth, latency=inner.latency, level=inner.name)
    outer = next((lv for lv in levels[1:] if lv.span >= span), levels[-1])
    members = max(1, min(size, inner.span // max(stride, 1)))
    bw = min(inner.bandwidth, members * outer.bandwidth)
    return GroupLink(bandwidth=bw, latency=outer.latency, level=outer.name, machines=-(-size // members))
