"""Assemble one rank's share of a run: model parts, expert/context parallel wiring, parallelism, optimizers and
the pipeline schedule."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from meshplan.runtime.config import RunConfig
from meshplan.runtime.cp import install_context_parallel
from meshplan.runtime.data import cp_positions
from meshplan.runtime.mesh import Meshes
from meshplan.runtime.models.decoder import Decoder, build_decoder
from meshplan.runtime.models.moe import ExpertGroup, MoE
from meshplan.runtime.parallelize import parallelize
from meshplan.runtime.pipeline import build_schedule, stage_layers, stages_of_rank
from meshplan.spec.checks import replica_shares
from meshplan.spec.model import ModelSpec


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy, computed in fp32. Vocabulary-sharded DTensor logits (loss parallel) need
    ``loss_context`` around forward and backward; the loss comes back as a plain (replicated) tensor."""
    loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
    return loss.to_local() if isinstance(loss, DTensor) else loss


def weighted_loss(logits: torch.Tensor, targets: torch.Tensor, *, weight: float) -> torch.Tensor:
    """``loss_fn`` times a micro-batch's weight (the pipeline schedule's loss under uneven batch shares)."""
    return loss_fn(logits, targets) * weight


def loss_context(t: "Trainer"):
    """torch's ``loss_parallel`` when the last stage's logits are sharded by vocabulary, else nothing."""
    import contextlib

    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel() if any(p.vocab_parallel for p in t.parts) else contextlib.nullcontext()


@dataclass(frozen=True, kw_only=True)
class ExpertSync:
    """Expert-parallel groups: experts are sharded over ``ep`` (and their FFN width over ``etp``); copies of the
    same expert shard live on ``ep_replica``."""

    mesh: DeviceMesh
    """4-D mesh (ep_outer, ep_replica, ep, etp); expert weights are DTensors sharded on ``ep`` (and ``etp``)."""
    divide: int
    """Ranks whose loss contributes to each expert gradient (dp * cp): the gradient-average denominator."""


@dataclass(frozen=True, kw_only=True)
class TiedSync:
    """Tied embeddings under pipeline parallelism: the first and the last stage each hold a copy (Megatron)."""

    params: tuple[torch.nn.Parameter, ...]
    """This rank's copies (none, one, or both when one rank holds the first and the last stage)."""
    group: dist.ProcessGroup | None
    """The two pp ranks holding the first and the last stage, or None when one rank holds both."""
    duplicate: tuple[torch.nn.Parameter, ...]
    """Copies held for the output head only: stepped, but left out of the gradient norm."""


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
    tp_partial: tuple[torch.nn.Parameter, ...] = ()
    """Parameters kept whole on every tp rank whose gradients are partial sums over tp (MoE routers and shared
    experts, which each tp rank runs on its own tokens or its slice of the experts; learned positions under SP);
    summed after backward."""
    tied: TiedSync | None = None
    """Tied-embedding copies across pipeline stages, or None."""
    bf16: bool = False
    """Compute in bf16 through FSDP2's mixed-precision policy (fp32 master weights and gradient reduction)."""
    n_micro: int = 1
    """Micro-batches this rank's replica runs per step (its batch share; the plan's n_micro when even)."""
    micro_weight: float | None = None
    """Uneven batch shares: the factor dp * micro_batch / global_batch on every micro-batch's mean loss, so that
    the data-parallel average of the replicas' summed gradients is the global-batch mean. None (even shares): each
    micro-batch's loss / n_micro, and the pipeline schedule's own 1/n_micro gradient scaling."""


def expert_mesh(meshes: Meshes, device_type: str) -> DeviceMesh:
    """Megatron's expert layout: within a pipeline stage, ranks in the plan's rank order are cut into
    (ep_replica, ep, etp) with etp fastest. With etp = 1 the ep group folds over tp, cp and dp in rank order;
    with etp = tp the etp axis is the tp axis and ep folds over cp and dp."""
    plan = meshes.plan
    names = list(meshes.world.mesh_dim_names)
    inner = ("tp",) if plan.etp > 1 else ()
    order = [names.index("pp")] + [names.index(n) for n in names if n not in ("pp",) + inner] + \
        [names.index(n) for n in inner]
    n = plan.tp * plan.cp * plan.dp
    ranks = meshes.world.mesh.permute(order).reshape(plan.pp, n // (plan.ep * plan.etp), plan.ep, plan.etp)
    return DeviceMesh(device_type, ranks, mesh_dim_names=("ep_outer", "ep_replica", "ep", "etp"))


def _expert_dtensor(p: torch.Tensor, name: str, mesh: DeviceMesh) -> torch.nn.Parameter:
    """Experts sharded on ep (dim 0) and, with etp > 1, on their FFN width (w1/w3 dim 2, w2 dim 1)."""
    if mesh["etp"].size() == 1:
        return torch.nn.Parameter(DTensor.from_local(p.detach(), mesh["ep"], [Shard(0)], run_check=False))
    ffn = Shard(1) if name == "w2" else Shard(2)
    return torch.nn.Parameter(DTensor.from_local(p.detach(), mesh["ep", "etp"], [Shard(0), ffn], run_check=False))


def _shard_experts(part: Decoder, mesh: DeviceMesh) -> list[torch.nn.Parameter]:
    ep, etp = mesh["ep"], mesh["etp"]
    group = ExpertGroup(group=ep.get_group(), size=ep.size(), rank=ep.get_local_rank())
    params = []
    for m in part.modules():
        if isinstance(m, MoE):
            m.shard_experts(group, etp=etp.size(), etp_rank=etp.get_local_rank())
            for name in ("w1", "w2", "w3"):
                p = getattr(m, name)
                if p is not None:
                    setattr(m, name, _expert_dtensor(p, name, mesh))
                    params.append(getattr(m, name))
    return params


def _tp_partial_params(parts: list[Decoder], *, experts_too: bool, sp: bool) -> tuple[torch.nn.Parameter, ...]:
    out: list[torch.nn.Parameter] = []
    for part in parts:
        if sp and part.pos_embeddings is not None:
            out.append(part.pos_embeddings.weight)
        for m in part.modules():
            if isinstance(m, MoE):
                out += list(m.router.parameters()) + (list(m.shared.parameters()) if m.shared is not None else [])
                out += m.expert_params() if experts_too else []
    return tuple(out)


def _tied_group(plan, meshes: Meshes):
    """The pp pair holding the first and the last stage that this rank is in (None when one rank holds both, or
    this rank is in none). Every rank of the world creates every pair's group, in the same order."""
    holder = {s: r for r in range(plan.pp) for s in stages_of_rank(plan, r)}
    first, last = holder[0], holder[plan.n_stages - 1]
    group = None
    if first != last:
        names = meshes.world.mesh_dim_names
        rows = meshes.world.mesh.movedim(names.index("pp"), -1).reshape(-1, plan.pp)
        for row in rows.tolist():
            g = dist.new_group([row[first], row[last]])
            if dist.get_rank() in (row[first], row[last]):
                group = g
    return group


def _tied_sync(plan, meshes: Meshes, parts: list[Decoder], stage_ids: tuple[int, ...]) -> TiedSync:
    """Copies of the tied embedding on this rank and the pp pair holding the first and the last stage."""
    group = _tied_group(plan, meshes)
    params = tuple(p.tok_embeddings.weight for p in parts if p.tok_embeddings is not None)
    duplicate = tuple(p.tok_embeddings.weight for p, s in zip(parts, stage_ids)
                      if p.tok_embeddings is not None and s != 0)
    return TiedSync(params=params, group=group, duplicate=duplicate)


def _build_part(cfg: RunConfig, spec: ModelSpec, stage: int) -> Decoder:
    plan = cfg.plan
    layers = stage_layers(spec, plan, stage) if plan.pp > 1 else None
    return build_decoder(spec, layer_ids=layers, first=stage == 0, last=stage == plan.n_stages - 1,
                         seed=cfg.seed, max_seq_len=plan.seq_len)


def uses_bf16(plan, device_type: str) -> bool:
    """bf16 compute: a bf16 plan on a GPU (a CPU run keeps fp32, the reference's precision)."""
    return plan.precision == "bf16" and device_type == "cuda"


def _mesh_groups(part: torch.nn.Module) -> list[dict]:
    """The part's parameters as one AdamW group per device mesh (plain tensors on their own): a multi-tensor
    (foreach) kernel cannot mix DTensors of different meshes with plain tensors."""
    groups: dict[int, list] = {}
    for p in part.parameters():
        groups.setdefault(id(getattr(p, "device_mesh", None)), []).append(p)  # by identity: no tensor reads
    return [{"params": ps} for ps in groups.values()]


def build_trainer(cfg: RunConfig, spec: ModelSpec, meshes: Meshes, device: torch.device, *,
                  bf16: bool | None = None, ep_mesh: DeviceMesh | None = None) -> Trainer:
    """Build, wire and parallelize this rank's parts; create optimizers and the schedule. ``bf16``: compute in
    bf16 (default: ``uses_bf16``; memcheck forces it to simulate a GPU run on fake CPU tensors); ``ep_mesh``:
    the expert mesh when built beforehand (memcheck builds meshes outside fake mode; they read real ranks)."""
    plan = cfg.plan
    if not meshes.active:
        return _idle_trainer(cfg, spec, meshes, device)
    bf16 = uses_bf16(plan, device.type) if bf16 is None else bf16
    stage_ids = stages_of_rank(plan, meshes.rank_in("pp")) if plan.pp > 1 else (0,)
    positions = cp_positions(plan.seq_len, cp_rank=meshes.rank_in("cp"), cp=plan.cp,
                             zigzag=plan.cp_kind == "ring").to(device)
    if ep_mesh is None and spec.is_moe and plan.ep * plan.etp > 1:
        ep_mesh = expert_mesh(meshes, device.type)
    parts = []
    for stage in stage_ids:
        part = _build_part(cfg, spec, stage).to(device)
        ignored = set(_shard_experts(part, ep_mesh)) if ep_mesh is not None else set()
        if plan.cp > 1:
            install_context_parallel(part, meshes.axis("cp").get_group(), kind=plan.cp_kind)
        # Later pipeline stages see sequence-parallel shards, so positions cannot come from the input's length.
        part.positions = positions
        parts.append(parallelize(part, meshes, ignored=ignored, bf16=bf16))
    # The stack's fused_optimizer: torch's multi-tensor (foreach) AdamW, or its per-tensor loop.
    optimizers = tuple(torch.optim.AdamW(_mesh_groups(p), lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                                         foreach=cfg.stack.fused_optimizer) for p in parts)
    n_micro = replica_shares(plan, cfg.pool_sizes())[meshes.rank_in("dp")]
    # Uneven shares: every sequence weighs the same in the DP average (torch's schedule scales gradients by
    # 1/n_micro after the data-parallel reduction, which would weigh replicas unequally, so it is turned off).
    weight = plan.dp * plan.micro_batch / plan.global_batch if plan.batch_shares else None
    schedule = None
    if plan.pp > 1:
        schedule = build_schedule(plan=plan, parts=parts, stage_ids=stage_ids, device=device, n_micro=n_micro,
                                  group=meshes.axis("pp").get_group(), scale_grads=weight is None,
                                  loss_fn=loss_fn if weight is None else partial(weighted_loss, weight=weight))
    experts = ExpertSync(mesh=ep_mesh, divide=plan.dp * plan.cp) if ep_mesh is not None else None
    tp_partial = _tp_partial_params(parts, experts_too=ep_mesh is None, sp=plan.sp) if plan.tp > 1 else ()
    tied = _tied_sync(plan, meshes, parts, stage_ids) if plan.pp > 1 and spec.tied_embeddings else None
    return Trainer(cfg=cfg, spec=spec, meshes=meshes, device=device, parts=tuple(parts), stage_ids=stage_ids,
                   optimizers=optimizers, schedule=schedule, positions=positions, experts=experts,
                   tp_partial=tp_partial, tied=tied, bf16=bf16, n_micro=n_micro, micro_weight=weight)


def _idle_trainer(cfg: RunConfig, spec: ModelSpec, meshes: Meshes, device: torch.device) -> Trainer:
    """A rank outside the plan's mesh holds nothing; it still takes part in creating the groups the others do."""
    plan = cfg.plan
    if spec.is_moe and plan.ep * plan.etp > 1:
        expert_mesh(meshes, device.type)
    if plan.pp > 1 and spec.tied_embeddings:
        _tied_group(plan, meshes)
    return Trainer(cfg=cfg, spec=spec, meshes=meshes, device=device, parts=(), stage_ids=(), optimizers=(),
                   schedule=None, positions=torch.empty(0, dtype=torch.long), experts=None, n_micro=0)


def _local_grad(p: torch.nn.Parameter) -> torch.Tensor | None:
    if p.grad is None:
        return None
    return p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad


def sync_expert_grads(t: Trainer) -> None:
    """Average expert gradients over every rank holding the same experts (FSDP leaves them alone)."""
    if t.experts is None:
        return
    group = t.experts.mesh["ep_replica"].get_group()
    for part in t.parts:
        for m in part.modules():
            if isinstance(m, MoE):
                for p in m.expert_params():
                    local = _local_grad(p)
                    if local is None:
                        continue
                    if dist.get_world_size(group) > 1:
                        dist.all_reduce(local, group=group)
                    local.div_(t.experts.divide)


def _sync_tp_partial(t: Trainer) -> None:
    group = t.meshes.tp.get_group() if t.tp_partial else None
    for p in t.tp_partial:
        local = _local_grad(p)
        if local is not None:
            dist.all_reduce(local, group=group)


def _sync_tied(t: Trainer) -> None:
    """Sum the tied embedding's gradient over its copies (the first stage's input use plus the last stage's output
    use), so every copy takes the same optimizer step."""
    if t.tied is None or not t.tied.params:
        return
    for p in t.tied.params:
        # A vocabulary-sharded embedding's lookup leaves a replicated gradient; the head's is sharded like the
        # weight. Sum them in the weight's layout (a local slice, no communication).
        if isinstance(p.grad, DTensor) and p.grad.placements != p.placements:
            p.grad = p.grad.redistribute(placements=p.placements)
    grads = [g for g in (_local_grad(p) for p in t.tied.params) if g is not None]
    total = torch.stack(grads).sum(0) if len(grads) > 1 else grads[0].clone()
    if t.tied.group is not None:
        dist.all_reduce(total, group=t.tied.group)
    for g in grads:
        g.copy_(total)


def sync_grads(t: Trainer) -> None:
    """Every gradient reduction FSDP does not do: experts over their replicas, tp-partial parameters over tp, tied
    embeddings over the first and last stage."""
    sync_expert_grads(t)
    _sync_tp_partial(t)
    _sync_tied(t)
