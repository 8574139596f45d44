"""Seconds and memory of a layout switch, live (point-to-point inside the running job) or through a checkpoint
(save, restart, load), from the per-rank bytes of ``cost.transition``.

Live: the busiest rank's bytes over its links (scale-up for its domain, NIC for the rest), per message a link
latency, communicator set-up for the new groups, and storage reads for whatever no survivor holds
(``shared/notes/elastic.md`` sec. 4.2). The bound uses the links' rated bandwidth; the calibrated time the
achieved fraction the step-time model already fits for collectives (``Calibration.intra_eff/inter_eff``, one
home per quantity). Checkpoint: every rank writes its shard and reads the new one at its share of the storage
bandwidth (DCP), plus a torchrun restart (sec. 4.5).
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np

from meshplan.cost.transition import TransferBytes
from meshplan.spec.calibration import Calibration
from meshplan.spec.cluster import Pool

GiB = 2**30


@dataclass(frozen=True, kw_only=True)
class SwitchCosts:
    """The constants of a switch that are not the links' (documented defaults with their sources, not fitted)."""

    comm_init_s: float = 0.47
    """Set-up of one new communicator split from the world's (s): NCCL init timings on 8 GPUs, allgathers 0.08 s +
    connections 0.39 s (NVIDIA/nccl#1646; bootstrap and topology are the parent's under ``ncclCommSplit``)."""
    comm_init_cpu_s: float = 0.006
    """The same on gloo (a ``new_group`` + all-reduce mid-run, 6 ms: shared/notes/elastic.md sec. 3.1 check 3)."""
    restart_s: float = 35.0
    """Tearing down and relaunching the job under torchrun (s): the rendezvous ``last_call`` wait, 30 s
    (torch 2.13 ``rendezvous/dynamic_rendezvous.py``), plus process launch and ``import torch``, 2-5 s."""
    storage_gbs_per_gpu: float = 0.122
    """Checkpoint storage bandwidth per GPU (GB/s): Llama 3's Tectonic sustains 2 TB/s for 16K H100s (Dubey et
    al. 2024 sec. 3.3.1)."""
    staging_min: float = 1 * GiB
    """Smallest transfer chunk per rank (bytes): ElasticMegatron ``transfer/chunk_schedule.py`` clamps
    ``min_free/2`` to 1-8 GiB."""
    staging_max: float = 8 * GiB
    """Largest transfer chunk per rank (bytes), same source."""
    groups_prebuilt: bool = False
    """The new layout's communicators exist before the switch (ElasticMegatron creates every strategy's groups at
    start): no set-up on the switch's critical path."""


@dataclass(frozen=True)
class Overhead:
    """What a live switch costs beyond its bytes: fitted by ``meshplan.calibrate.transition_fit`` from published
    switches (NeMo-RL's refits on H100)."""

    fixed_s: float
    """Planning and synchronising the switch (s)."""
    per_tensor_s: float
    """Per tensor the busiest rank copies (s): slicing, packing, one batched send/recv entry, one load."""


@lru_cache(maxsize=1)
def _fitted_table() -> dict[str, Overhead]:
    path = resources.files("meshplan.calibrate").joinpath("transition_constants.toml")
    if not path.is_file():
        return {}
    data = tomllib.loads(path.read_text())
    return {gen: Overhead(fixed_s=float(v["fixed_s"]), per_tensor_s=float(v["per_tensor_s"]))
            for gen, v in data.items() if isinstance(v, dict)}


def fitted_overhead(generation: str, table: dict[str, Overhead] | None = None) -> Overhead:
    """The generation's fitted overhead; a GPU generation without published switches takes Hopper's (the
    per-tensor work is host-side, not the GPU's); a CPU host has none until the runtime's switch measures it."""
    table = _fitted_table() if table is None else table
    if generation in table:
        return table[generation]
    if generation == "cpu" or "hopper" not in table:
        return Overhead(fixed_s=0.0, per_tensor_s=0.0)
    return table["hopper"]


@dataclass(frozen=True, kw_only=True)
class SwitchTime:
    """Predicted cost of one switch."""

    bound_s: float
    """Busiest rank's bytes over its links at rated bandwidth (s): no switch is faster."""
    transfer_s: float
    """The same at the achieved bandwidth, plus per-message latency (s)."""
    overhead_s: float
    """Fixed and per-tensor work of the switch (s, fitted)."""
    rebuild_s: float
    """Communicator set-up for the new groups (s)."""
    storage_s: float
    """Reading the state no survivor holds (s)."""
    total_s: float
    """Predicted live switch (s)."""
    checkpoint_s: float
    """The same switch through a checkpoint: save, restart, load (s)."""
    peak_bytes: float
    """Largest persistent + staging bytes on one rank during the move."""
    staging: float
    """Chunk size per rank (bytes)."""
    chunks: int
    """Exchange rounds."""
    messages: int
    """Messages of the busiest rank."""


def _links(pool: Pool) -> tuple[float, float, float, float]:
    levels = pool.network()
    return levels[0].bandwidth, levels[-1].bandwidth, levels[0].latency, levels[-1].latency


def switch_time(x: TransferBytes, *, phys_b: np.ndarray, pool: Pool, calib: Calibration, costs: SwitchCosts,
                new_groups: int, overhead: Overhead | None = None) -> SwitchTime:
    """Seconds of a live switch whose bytes are ``x`` (new ranks on GPU ids ``phys_b``) on ``pool``'s links;
    ``overhead``: None = the generation's fitted one."""
    overhead = overhead or fitted_overhead(pool.gpu.generation)
    bw_l, bw_f, lat_l, lat_f = _links(pool)
    cpu = pool.gpu.generation == "cpu"
    inflow = x.in_local + x.in_fabric
    capacity = pool.gpu.hbm_bytes
    resident = np.maximum(x.need, x.resident_a[phys_b])
    free = capacity - resident
    staging = float(np.clip(free.min() / 2, costs.staging_min, costs.staging_max))
    chunks = max(1, math.ceil(float(inflow.max()) / staging)) if inflow.max() > 0 else 0
    out_l, out_f = x.out_local[phys_b], x.out_fabric[phys_b]

    def busiest(eff_l: float, eff_f: float) -> np.ndarray:
        return np.maximum.reduce([x.in_local / (bw_l * eff_l), x.in_fabric / (bw_f * eff_f),
                                  out_l / (bw_l * eff_l), out_f / (bw_f * eff_f)])
    bound = float(busiest(1.0, 1.0).max()) if inflow.size else 0.0
    messages = x.peers + (chunks if chunks else 0)
    latency = np.where(x.in_fabric > 0, lat_f, lat_l) * messages
    # Packing what a rank sends into one buffer per peer and unpacking what it receives: one read and one write
    # of each byte in device memory (torch.cat and copy_ in runtime/reshard.py; NeMo-RL packs the same way).
    packing = (inflow + out_l + out_f) * 2 / (pool.gpu.hbm_bandwidth * calib.mem_eff)
    transfer = float((busiest(calib.intra_eff, calib.inter_eff) + latency + packing).max()) if inflow.size else 0.0
    rebuild = 0.0 if costs.groups_prebuilt else new_groups * (costs.comm_init_cpu_s if cpu else costs.comm_init_s)
    storage = float(x.lost.max()) / (costs.storage_gbs_per_gpu * 1e9) if x.lost.size else 0.0
    peak = float((resident + np.minimum(staging, inflow + out_l + out_f)).max())
    save = float(x.resident_a.max()) / (costs.storage_gbs_per_gpu * 1e9)
    load = float(x.need.max()) / (costs.storage_gbs_per_gpu * 1e9)
    init = new_groups * (costs.comm_init_cpu_s if cpu else costs.comm_init_s)
    work = (overhead.fixed_s + overhead.per_tensor_s * float(x.tensors.max())) if x.tensors.max() > 0 else 0.0
    return SwitchTime(bound_s=bound, transfer_s=transfer, overhead_s=work, rebuild_s=rebuild, storage_s=storage,
                      total_s=transfer + work + rebuild + storage, checkpoint_s=save + costs.restart_s + init + load,
                      peak_bytes=peak, staging=staging, chunks=chunks, messages=int(messages.max()) if messages.size
                      else 0)


def new_groups(plan) -> int:
    """Communicators a layout needs per rank beyond the world: one per mesh axis of degree > 1, the flattened
    dp x cp and (with experts) the ep/etp groups, as ``runtime/mesh.py`` and ``runtime/build.py`` build them."""
    axes = [plan.tp, plan.cp, plan.pp, plan.dp_replicate, plan.shard_group]
    n = sum(1 for d in axes if d > 1)
    if plan.dp * plan.cp > 1:
        n += 1
    if plan.ep * plan.etp > 1:
        n += 1 + (plan.etp > 1)
    return n
