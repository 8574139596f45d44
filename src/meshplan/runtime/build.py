"""Assemble one rank's share of a run: model parts, expert/context parallel wiring, parallelism, optimizers and
the pipeline schedule."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from meshplan.runtime.config import RunConfig
from meshplan.runtime.cp import install_ring_attention
from meshplan.runtime.data import cp_positions
from meshplan.runtime.mesh import Meshes
from meshplan.runtime.models.decoder import Decoder, build_decoder
from meshplan.runtime.models.moe import ExpertGroup, MoE
from meshplan.runtime.parallelize import parallelize
from meshplan.runtime.pipeline import build_schedule, stage_layers, stages_of_rank
from meshplan.spec.model import ModelSpec


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy, computed in fp32."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


@dataclass(frozen=True, kw_only=True)
class ExpertSync:
    """Expert-parallel groups: experts are sharded over ``ep``; copies of the same experts live on ``replica``."""

    mesh: DeviceMesh
    """3-D mesh (ep_outer, ep_replica, ep); expert weights are DTensors sharded on its ``ep`` axis."""
    divide: int
    """Ranks whose loss contributes to each expert gradient (dp * cp): the gradient-average denominator."""


@dataclass(frozen=True, kw_only=True)
class Trainer:
    """Everything one rank needs for a training step."""

    cfg: RunConfig
    """The run."""
    spec: ModelSpec
    """The model."""
    meshes: Meshes
    """Device meshes of the plan."""
    device: torch.device
    """Compute device."""
    parts: tuple[Decoder, ...]
    """Model parts this rank holds (pipeline stages; one part without pp)."""
    stage_ids: tuple[int, ...]
    """Global pipeline stage index of each part."""
    optimizers: tuple[torch.optim.Optimizer, ...]
    """One AdamW per part (checkpoints flatten their state by parameter name)."""
    schedule: object | None
    """torch.distributed.pipelining schedule, or None without pp."""
    positions: torch.Tensor
    """Sequence positions this rank holds (all of them without cp)."""
    experts: ExpertSync | None
    """Expert-parallel wiring, or None."""


def _expert_mesh(meshes: Meshes, device_type: str) -> DeviceMesh:
    """Split dp into (dp/ep, ep) with ep innermost; the replica axis also spans cp and pp-free copies."""
    plan = meshes.plan
    names = meshes.world.mesh_dim_names
    order = [names.index(n) for n in ("pp", "tp", "cp", "dp_replicate", "dp_shard")]
    ranks = meshes.world.mesh.permute(order).reshape(plan.pp * plan.tp, plan.cp * plan.dp // plan.ep, plan.ep)
    return DeviceMesh(device_type, ranks, mesh_dim_names=("ep_outer", "ep_replica", "ep"))


def _shard_experts(part: Decoder, mesh: DeviceMesh) -> list[torch.nn.Parameter]:
    ep = mesh["ep"]
    group = ExpertGroup(group=ep.get_group(), size=ep.size(), rank=ep.get_local_rank())
    params = []
    for m in part.modules():
        if isinstance(m, MoE):
            m.shard_experts(group)
            for name in ("w1", "w2", "w3"):
                p = getattr(m, name)
                if p is not None:
                    dt = DTensor.from_local(p.detach(), ep, [Shard(0)], run_check=False)
                    setattr(m, name, torch.nn.Parameter(dt))
                    params.append(getattr(m, name))
    return params


def _build_part(cfg: RunConfig, spec: ModelSpec, stage: int) -> Decoder:
    plan = cfg.plan
    layers = stage_layers(spec, plan, stage) if plan.pp > 1 else None
    return build_decoder(spec, layer_ids=layers, first=stage == 0, last=stage == plan.n_stages - 1,
                         seed=cfg.seed, max_seq_len=plan.seq_len)


def build_trainer(cfg: RunConfig, spec: ModelSpec, meshes: Meshes, device: torch.device) -> Trainer:
    """Build, wire and parallelize this rank's parts; create optimizers and the schedule."""
    plan = cfg.plan
    stage_ids = stages_of_rank(plan, meshes.rank_in("pp")) if plan.pp > 1 else (0,)
    positions = cp_positions(plan.seq_len, cp_rank=meshes.rank_in("cp"), cp=plan.cp).to(device)
    ep_mesh = _expert_mesh(meshes, device.type) if plan.ep > 1 else None
    parts = []
    for stage in stage_ids:
        part = _build_part(cfg, spec, stage).to(device)
        ignored = set(_shard_experts(part, ep_mesh)) if ep_mesh is not None else set()
        if plan.cp > 1:
            install_ring_attention(part, meshes.axis("cp").get_group())
        # Later pipeline stages see sequence-parallel shards, so positions cannot come from the input's length.
        part.positions = positions
        parts.append(parallelize(part, meshes, ignored=ignored))
    optimizers = tuple(torch.optim.AdamW(p.parameters(), lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                                         foreach=False) for p in parts)
    schedule = None
    if plan.pp > 1:
        schedule = build_schedule(plan=plan, parts=parts, stage_ids=stage_ids, device=device,
                                  group=meshes.axis("pp").get_group(), loss_fn=loss_fn)
    experts = ExpertSync(mesh=ep_mesh, divide=plan.dp * plan.cp) if ep_mesh is not None else None
    return Trainer(cfg=cfg, spec=spec, meshes=meshes, device=device, parts=tuple(parts), stage_ids=stage_ids,
                   optimizers=optimizers, schedule=schedule, positions=positions, experts=experts)


def sync_expert_grads(t: Trainer) -> None:
    """Average expert gradients over every rank holding the same experts (FSDP leaves them alone)."""
    if t.experts is None:
        return
    group = t.experts.mesh["ep_replica"].get_group()
    for part in t.parts:
        for m in part.modules():
            if isinstance(m, MoE):
                for p in m.expert_params():
                    if p.grad is None:
                        continue
                    local = p.grad.to_local()
                    if dist.get_world_size(group) > 1:
                        dist.all_reduce(local, group=group)
                    local.div_(t.experts.divide)
