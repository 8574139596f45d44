"""Collective communication time: latency + bytes / bandwidth x the algorithm's bus factor, placed on the
network level that each process group spans.

Bus factors are those of nccl-tests' PERFORMANCE.md (ring algorithms): all-reduce 2(n-1)/n, all-gather and
reduce-scatter (n-1)/n of the full buffer, all-to-all (n-1)/n of the local buffer, send/recv 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from meshplan.errors import unknown_name
from meshplan.spec.calibration import Calibration
from meshplan.spec.cluster import GroupLink, Pool, group_link
from meshplan.spec.plan import Plan


@dataclass(frozen=True, kw_only=True)
class Collective:
    """A collective algorithm: bus factor and latency steps as functions of the group size."""

    name: str
    """Registry name."""
    bus_factor: Callable[[int], float]
    """Multiplier on bytes / bandwidth."""
    steps: Callable[[int], float]
    """Latency-bound steps."""


COLLECTIVES: dict[str, Collective] = {c.name: c for c in (
    Collective(name="all_reduce", bus_factor=lambda n: 2 * (n - 1) / n, steps=lambda n: 2 * (n - 1)),
    Collective(name="all_gather", bus_factor=lambda n: (n - 1) / n, steps=lambda n: n - 1),
    Collective(name="reduce_scatter", bus_factor=lambda n: (n - 1) / n, steps=lambda n: n - 1),
    Collective(name="all_to_all", bus_factor=lambda n: (n - 1) / n, steps=lambda n: n - 1),
    Collective(name="send_recv", bus_factor=lambda n: 1.0, steps=lambda n: 1),
)}


def collective_time(kind: str, nbytes: float, *, size: int, link: GroupLink, calib: Calibration) -> float:
    """Seconds for one collective of ``nbytes`` (full buffer; local buffer for all-to-all) over ``size`` ranks."""
    if kind not in COLLECTIVES:
        raise unknown_name("collective", kind, COLLECTIVES)
    if size <= 1 or nbytes <= 0:
        return 0.0
    c = COLLECTIVES[kind]
    eff = calib.intra_eff if link.level == "nvlink" else calib.inter_eff
    if link.level == "pcie":
        eff = pcie_ring_eff(size)
    return c.steps(size) * link.latency + c.bus_factor(size) * nbytes / (link.bandwidth * eff)


PCIE_RING_EFF = ((4, 35.0 / 63.0), (2**31, 28.0 / 63.0))
"""(most ranks, NCCL ring bus bandwidth over one GPU's PCIe link) in a PCIe-only node: measured all-reduce busbw
of 35 GB/s on 4 and 28 GB/s on 8 GPUs of a dual-socket host, of PCIe Gen5 x16's 63 GB/s (NVIDIA/nccl#1639; the
maintainer: on PCIe the CPUs' and memory's bandwidth sets it, every GPU's flows crossing the host)."""


def pcie_ring_eff(size: int) -> float:
    """Share of a GPU's PCIe bandwidth an NCCL ring of ``size`` ranks in a PCIe-only node reaches (``PCIE_RING_EFF``:
    groups of a socket's GPUs or fewer, then groups that cross sockets)."""
    return next(eff for most, eff in PCIE_RING_EFF if size <= most)


@dataclass(frozen=True, kw_only=True)
class Links:
    """The link of every process group of a plan inside one pool."""

    tp: GroupLink
    """Tensor-parallel group."""
    cp: GroupLink
    """Context-parallel group."""
    ep: GroupLink
    """Expert-parallel group (inside dp x cp x tp)."""
    dp: GroupLink
    """Gradient-reduction group of dense parameters (dp x cp ranks)."""
    dp_shard: GroupLink
    """ZeRO/FSDP sharding group (shard group x cp)."""
    dp_replicate: GroupLink
    """HSDP replica group."""
    pp: GroupLink
    """Neighbouring pipeline stages."""
    servers: float | None = None
    """Parameter-server bandwidth the cluster's CPU machines offer all groups together, each direction (bytes/s;
    ``ClusterSpec.server_capacity``); None = not known here (search bounds: as if unlimited, which only lowers
    a bound)."""


def plan_links(plan: Plan, pool: Pool, *, servers: float | None = None) -> Links:
    """Links of each axis group under the plan's rank order (Megatron default tp-cp-ep-dp-pp); ``servers``: the
    cluster's parameter-server bandwidth (``Links.servers``)."""
    st = {a: plan.stride(a) for a in ("tp", "cp", "dp", "pp")}

    def link(size: int, stride: int) -> GroupLink:
        return group_link(pool, size=size, stride=stride)

    # Megatron reduces dense gradients over dp x cp; when cp sits just inside dp the two form one block.
    dpcp_stride = min(st["dp"], st["cp"]) if plan.cp > 1 else st["dp"]
    shard = plan.shard_group
    return Links(
        tp=link(plan.tp, st["tp"]), cp=link(plan.cp, st["cp"]),
        # Expert layers regroup tp x cp x dp as etp-ep-edp (Megatron MoE layout): ep members are etp apart.
        ep=link(plan.ep, plan.etp),
        dp=link(plan.dp * plan.cp, dpcp_stride), dp_shard=link(plan.zero_group, dpcp_stride),
        dp_replicate=link(plan.dp // max(shard, 1), st["dp"] * shard), pp=link(2, st["pp"]), servers=servers)
