"""How data-parallel replicas synchronise gradients: one registry entry per method, each pricing the reduction of
``nbytes`` of gradients over a data-parallel group (``Plan.sync`` names the method; ``cost.dp`` calls it).

- ``allreduce``: ring all-reduce, 2(n-1)/n of the buffer over every rank's link (nccl-tests PERFORMANCE.md);
  DDP and ZeRO 0.
- ``reduce_scatter``: ZeRO 1-3 reduce-scatter the gradients, (n-1)/n of the buffer, and all-gather the updated
  weights (Rajbhandari et al. 2020, sec. 7; the gather is priced by ``cost.dp``).
- ``ps``: a sharded parameter server whose summation runs on CPU machines (BytePS, Jiang et al. OSDI'20, sec.
  3.2): every GPU machine pushes its gradients once and pulls the sums once; with k server machines beside n GPU
  machines the shares that balance both sides give the optimum of Theorem 1, which is all-reduce at k = 0 and
  M / B (half of all-reduce's 2(n-1)/n M / B) once the servers' bandwidth matches the workers'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from meshplan.cost.comm import COLLECTIVES, collective_time
from meshplan.errors import unknown_name
from meshplan.spec.calibration import Calibration
from meshplan.spec.cluster import GroupLink


@dataclass(frozen=True, kw_only=True)
class SyncContext:
    """What a method needs to know about the group beyond its link."""

    machines: int = 1
    """Scale-up domains (GPU machines) the group spans."""
    servers: float = 0.0
    """Server bandwidth this group can use, each direction (bytes/s): the cluster's server machines shared by the
    data-parallel groups that synchronise at the same time."""
    machine_bandwidth: float = 0.0
    """Scale-out bandwidth of the group's members on one GPU machine, each direction (bytes/s)."""


@dataclass(frozen=True, kw_only=True)
class SyncMethod:
    """One way to synchronise gradients."""

    name: str
    """Registry name (``Plan.dp_sync``)."""
    source: str
    """Where its traffic pattern comes from."""
    reduce: Callable[..., float]
    """``f(nbytes, size=, link=, calib=, ctx=)``: seconds to reduce ``nbytes`` of gradients over ``size`` ranks."""


def _allreduce(nbytes: float, *, size: int, link: GroupLink, calib: Calibration, ctx: SyncContext) -> float:
    return collective_time("all_reduce", nbytes, size=size, link=link, calib=calib)


def _reduce_scatter(nbytes: float, *, size: int, link: GroupLink, calib: Calibration, ctx: SyncContext) -> float:
    return collective_time("reduce_scatter", nbytes, size=size, link=link, calib=calib)


def ps_share(n: int, rho: float) -> float:
    """Share of the gradients a GPU machine's own summation service sums (BytePS Theorem 1 with server bandwidth
    ``rho`` times one GPU machine's): y / M = (n - rho) / (n^2 + (n - 2) rho), none once rho >= n. Each GPU
    machine then sends and receives M + (n - 2) y; each server n x, with k x + n y = M."""
    return max(n - rho, 0.0) / (n * n + (n - 2) * rho)


def ps_over_allreduce(n: int, rho: float) -> float:
    """BytePS's time over ring all-reduce's for n GPU machines: (M + (n - 2) y) / (2 (n - 1) M / n) when the
    servers keep up, else the servers' n x / (rho B) (Theorem 1; 1 at rho = 0, n / (2 (n - 1)) at rho >= n)."""
    if n <= 1:
        return 1.0
    y = ps_share(n, rho)
    worker = 1.0 + (n - 2) * y
    server = n * (1.0 - n * y) / rho if rho > 0 else 0.0
    return max(worker, server) / (2.0 * (n - 1) / n)


def _ps(nbytes: float, *, size: int, link: GroupLink, calib: Calibration, ctx: SyncContext) -> float:
    ring = collective_time("all_reduce", nbytes, size=size, link=link, calib=calib)
    n = ctx.machines
    if n <= 1 or ring <= 0:
        return ring  # inside one machine the summation stays on its GPUs (BytePS's local reduce)
    latency = COLLECTIVES["all_reduce"].steps(size) * link.latency  # the ring's latency part of ``ring``
    rho = ctx.servers / max(ctx.machine_bandwidth, 1e-30)
    # One push and one pull per 4 MB partition, pipelined (BYTEPS_PARTITION_BYTES = 4096000, docs/env.md 0.2.5).
    return 2 * link.latency + (ring - latency) * ps_over_allreduce(n, rho)


SYNCS: dict[str, SyncMethod] = {m.name: m for m in (
    SyncMethod(name="allreduce", reduce=_allreduce, source="ring all-reduce, nccl-tests PERFORMANCE.md"),
    SyncMethod(name="reduce_scatter", reduce=_reduce_scatter, source="ZeRO, Rajbhandari et al. 2020 sec. 7"),
    SyncMethod(name="ps", reduce=_ps, source="BytePS, Jiang et al. OSDI'20 sec. 3.2 Theorem 1; bytedance/byteps "
                                             "0.2.5 docs/rationale.md"),
)}


def sync_method(name: str) -> SyncMethod:
    """A method by name, with close matches when unknown."""
    if name not in SYNCS:
        raise unknown_name("dp_sync", name, SYNCS)
    return SYNCS[name]
