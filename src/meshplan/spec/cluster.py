"""Cluster spec: *where* a model is trained. Pools of GPUs and a hierarchy of network levels.

A process group of ``size`` ranks placed with ``stride`` consecutive ranks apart spans ``stride * size``
consecutive GPUs; the innermost network level that contains that span carries its traffic. Where a group
crosses scale-up domains, each domain's members drive their own NIC rail in parallel (NCCL's rail-aligned
rings), so the group's bus bandwidth is ``members_per_domain * nic_bandwidth``, capped by the scale-up link.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.errors import SpecError
from meshplan.spec.hardware import GPUSpec


@dataclass(frozen=True, kw_only=True)
class NetworkLevel:
    """One level of the network hierarchy."""

    name: str
    """``nvlink``, ``leaf``, ``spine``..."""
    span: int
    """GPUs reachable inside one group of this level (8 for an HGX NVLink domain)."""
    bandwidth: float
    """Per-GPU unidirectional bandwidth at this level (bytes/s)."""
    latency: float
    """Per-hop latency (s)."""

    def __post_init__(self) -> None:
        if self.span < 1:
            raise SpecError(f"network.{self.name}.span", self.span, "must be >= 1")
        if self.bandwidth <= 0:
            raise SpecError(f"network.{self.name}.bandwidth", self.bandwidth, "must be positive")


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
        if self.n_gpus < 1:
            raise SpecError(f"pool[{self.gpu.name}].n_gpus", self.n_gpus, "must be >= 1")
        if self.gpus_per_node < 1:
            raise SpecError(f"pool[{self.gpu.name}].gpus_per_node", self.gpus_per_node, "must be >= 1")

    def network(self) -> tuple[NetworkLevel, ...]:
        """The network levels, innermost first, ending with one that spans the whole pool."""
        if self.levels:
            return self.levels
        g = self.gpu
        domain = max(min(g.nvlink_domain, self.n_gpus), 1) if g.nvlink_domain >= self.gpus_per_node \
            else self.gpus_per_node
        inner = NetworkLevel(name="nvlink", span=domain, bandwidth=g.intra_bandwidth, latency=g.intra_latency)
        if self.n_gpus <= domain:
            return (inner,)
        return (inner, NetworkLevel(name="fabric", span=self.n_gpus, bandwidth=g.nic_bandwidth,
                                    latency=g.nic_latency))


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """One or more pools. Homogeneous clusters have one pool."""

    pools: tuple[Pool, ...]
    """GPU pools; mixed-GPU clusters have several."""
    inter_pool_bandwidth: float = 0.0
    """Per-GPU bandwidth between pools (bytes/s); 0 means the slowest pool NIC."""
    name: str = ""
    """Optional label."""

    def __post_init__(self) -> None:
        if not self.pools:
            raise SpecError("cluster.pools", self.pools, "a cluster needs at least one pool")

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
        return "+".join(f"{p.n_gpus}x{p.gpu.name}" for p in self.pools)


@dataclass(frozen=True, kw_only=True)
class GroupLink:
    """The effective link that one process group's collectives run on."""

    bandwidth: float
    """Bus bandwidth available to the collective per rank (bytes/s)."""
    latency: float
    """Per-step latency (s)."""
    level: str
    """Name of the outermost network level the group crosses."""


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
    return GroupLink(bandwidth=bw, latency=outer.latency, level=outer.name)
