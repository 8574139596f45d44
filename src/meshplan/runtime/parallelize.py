"""Apply a plan's intra-stage parallelism to one model part: TP+SP (DTensor), activation checkpointing, FSDP2.

Order follows torchtitan: tensor parallel first (it rewrites parameters into DTensors on the tp axis), then
activation checkpointing, then fully_shard per block and on the part's root (FSDP shards what TP left).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from meshplan.runtime.mesh import Meshes
from meshplan.runtime.models.decoder import Decoder
from meshplan.runtime.models.layers import Attention
from meshplan.runtime.models.mla import MLA
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import Plan


def check_runtime_support(spec: ModelSpec, plan: Plan) -> list[str]:
    """What the runtime cannot run for this (model, plan), beyond plan_violations, as sentences."""
    out = []
    att = spec.decoder.attention
    if plan.tp > 1 and att is not None and att.kind == "gqa" and att.n_kv_heads % plan.tp \
            and plan.tp % att.n_kv_heads:
        out.append(f"tp={plan.tp} and the {att.n_kv_heads} kv heads must divide one another")
    if plan.etp > 1 and plan.etp != plan.tp:
        out.append(f"etp={plan.etp}: the runtime shards experts over the whole tp group (etp=1 or etp=tp={plan.tp})")
    if plan.etp > 1 and plan.etp == plan.tp and (plan.cp * plan.dp) % plan.ep:
        out.append(f"with etp=tp the experts fold inside cp*dp: ep={plan.ep} must divide cp*dp={plan.cp * plan.dp}")
    moe = [b.layer.moe for b in spec.blocks if b.layer.moe is not None]
    if plan.etp > 1 and any(m.expert_ffn_hidden % plan.etp for m in moe):
        out.append(f"etp={plan.etp} must divide the experts' ffn width")
    return out


def _attention_tp_plan(block: nn.Module, plan: Plan, seq) -> dict:
    """Heads sharded over tp. MLA and replicated kv heads keep some projections whole on every tp rank, which
    read a plain (local) input; their inputs' gradients are made whole where they are consumed."""
    att = block.attention
    rowwise = RowwiseParallel(output_layouts=seq)
    if isinstance(att, MLA):
        q = "attention.wq" if hasattr(att, "wq") else "attention.wq_b"
        return {"attention": PrepareModuleInput(input_layouts=(seq, None), desired_input_layouts=(Replicate(), None),
                                                use_local_output=True),
                q: ColwiseParallel(), "attention.wkv_b": ColwiseParallel(), "attention.wo": rowwise}
    if _replicates_kv(att, plan.tp):
        return {"attention": PrepareModuleInput(input_layouts=(seq, None), desired_input_layouts=(Replicate(), None),
                                                use_local_output=True),
                "attention.wq": ColwiseParallel(), "attention.wo": rowwise}
    return {"attention": PrepareModuleInput(input_layouts=(seq, None), desired_input_layouts=(Replicate(), None)),
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
            "attention.wo": rowwise}


def _replicates_kv(att: nn.Module, tp: int) -> bool:
    return isinstance(att, Attention) and att.wk.out_features // att.head_dim < tp


class ExpertTensorParallel(ParallelStyle):
    """MoE under etp = tp: gather the sequence in (its gradient is a partial sum: each rank's expert slices see all
    tokens), and sum the partial outputs back into the sequence layout (reduce-scatter under SP, else all-reduce).
    """

    def __init__(self, *, seq):
        super().__init__()
        self.seq = seq

    def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
        seq = (self.seq,)

        def gather_in(_mod, args):
            x = args[0]
            if not isinstance(x, DTensor):
                x = DTensor.from_local(x, device_mesh, seq, run_check=False)
            return (x.redistribute(placements=(Replicate(),)).to_local(grad_placements=(Partial(),)),) + args[1:]

        def sum_out(_mod, _args, out):
            return DTensor.from_local(out, device_mesh, (Partial(),), run_check=False).redistribute(
                placements=seq).to_local()

        module.register_forward_pre_hook(gather_in)
        module.register_forward_hook(sum_out)
        return module


def _moe_tp_plan(plan: Plan, seq) -> ParallelStyle:
    """etp=1: each tp rank routes its own sequence shard (gathered from nothing under SP, cut from the replicated
    sequence without it) through the expert-parallel group; etp=tp: every tp rank routes the whole sequence
    through its slice of the experts and the outputs are summed."""
    if plan.etp > 1:
        return ExpertTensorParallel(seq=seq)
    return PrepareModuleInputOutput(input_layouts=(seq,), desired_input_layouts=(Shard(1),), use_local_input=True,
                                    output_layouts=(Shard(1),), desired_output_layouts=(seq,), use_local_output=True)


def _layer_tp_plan(block: nn.Module, plan: Plan) -> dict:
    seq = Shard(1) if plan.sp else Replicate()
    out = _attention_tp_plan(block, plan, seq)
    if plan.sp:
        out["attention_norm"] = SequenceParallel()
        out["ffn_norm"] = SequenceParallel()
    if hasattr(block, "moe"):
        out["moe"] = _moe_tp_plan(plan, seq)
        return out
    out.update({
        "feed_forward": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(), "feed_forward.w2": RowwiseParallel(output_layouts=seq),
    })
    if block.feed_forward.w3 is not None:
        out["feed_forward.w3"] = ColwiseParallel()
    return out


def _wire_attention(att: nn.Module, meshes: Meshes) -> None:
    """Give MLA and kv-replicating attention the tp mesh their whole-kept activations' gradients sum over."""
    tp = meshes.plan.tp
    if isinstance(att, MLA):
        att.tp_mesh = meshes.tp
    elif _replicates_kv(att, tp):
        n_heads = att.wq.weight.shape[0] // att.head_dim  # the global width (a DTensor after tp)
        local = n_heads // tp
        first = meshes.rank_in("tp") * local
        att.kv_index = torch.arange(first, first + local, device=att.wk.weight.device) // att.group
        att.tp_mesh = meshes.tp


def _sequence_shard_of(meshes: Meshes):
    """Forward pre-hook: keep the positions of this tp rank's sequence shard (learned positions under SP are
    looked up for the shard only; their gradient is then a partial sum over tp, see tp_partial)."""
    tp, rank = meshes.plan.tp, meshes.rank_in("tp")

    def hook(_mod, args):
        return (args[0].chunk(tp)[rank],) + args[1:]
    return hook


def apply_tp(part: Decoder, meshes: Meshes) -> None:
    """Megatron-style tensor parallelism with optional sequence parallelism, via DTensor parallelize_module."""
    sp = meshes.plan.sp
    seq = Shard(1) if sp else Replicate()
    top: dict = {}
    if part.tok_embeddings is not None:  # the last stage's tied copy too: the head reads its vocabulary rows
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    if part.last:
        if sp:
            top["norm"] = SequenceParallel()
        if part.output is not None:
            # Loss parallel (torchtitan, Megatron's vocab-parallel cross-entropy): logits stay sharded by
            # vocabulary (Shard(-1)); no rank materializes the full-vocabulary logits.
            top["output"] = ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False)
        part.vocab_parallel = True
    # Between pipeline stages each tp rank passes its own local activations (the sequence shard under SP), so a
    # later stage needs no input redistribution.
    parallelize_module(part, meshes.tp, top)
    if part.pos_embeddings is not None and sp:
        part.pos_embeddings.register_forward_pre_hook(_sequence_shard_of(meshes))
    for block in part.layers.values():
        parallelize_module(block, meshes.tp, _layer_tp_plan(block, meshes.plan))
        _wire_attention(block.attention, meshes)


def apply_recompute(part: Decoder, plan: Plan) -> None:
    """Mark blocks for activation checkpointing: ``full`` recomputes whole layers (the first recompute_layers of
    the part, or all), ``selective`` recomputes only the attention core."""
    blocks = list(part.layers.values())
    if plan.recompute == "full":
        n = plan.recompute_layers or len(blocks)
        for b in blocks[:n]:
            b.recompute = "full"
    elif plan.recompute == "selective":
        for b in blocks:
            b.attention.recompute_core = True


def fsdp_mesh(meshes: Meshes, *, bf16: bool):
    """The mesh fully_shard uses: the plan's (dp_replicate, dp_shard*cp) mesh; with bf16 and dp*cp = 1 the
    size-1 ``dp_shard_cp`` mesh, so FSDP2's mixed precision (bf16 compute copies, fp32 master weights) applies to
    every layout; None for an fp32 run without data or context parallelism."""
    if meshes.fsdp is not None:
        return meshes.fsdp
    return meshes.flat["dp_shard_cp"] if bf16 else None


def apply_fsdp(part: Decoder, mesh, *, zero: int, ignored: set[nn.Parameter], bf16: bool,
               pipelined: bool = False) -> None:
    """FSDP2 per block and on the part: zero 3 reshards parameters after forward; zero 0/1/2 keep them gathered
    (gradients are still reduce-scattered, which is what ZeRO-1/2 amount to); HSDP when dp_replicate > 1.

    Under bf16 (torchtitan): ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``: the sharded fp32
    parameters are the optimizer's master weights, each unit is gathered in bf16 and gradients are reduced in
    fp32, so no autocast weight cache exists and activations are bf16."""
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 \
        else MixedPrecisionPolicy()
    # Under a pipeline, zero 3 keeps each unit gathered between its forward and backward, as torchtitan does
    # (re-gathering every micro-batch would be exposed traffic); the cost model assumes the same.
    kw = dict(mesh=mesh, reshard_after_forward=zero == 3 and not pipelined, ignored_params=ignored or None,
              mp_policy=policy)
    for block in part.layers.values():
        fully_shard(block, **kw)
    fully_shard(part, **kw)


def parallelize(part: Decoder, meshes: Meshes, *, ignored: set[nn.Parameter], bf16: bool = False) -> Decoder:
    """TP, recompute and FSDP as the plan asks, in that order; returns the same module. ``bf16``: compute in
    bf16 through FSDP2's mixed-precision policy (GPU runs and memcheck), else in the parameters' fp32."""
    if meshes.tp is not None:
        apply_tp(part, meshes)
    apply_recompute(part, meshes.plan)
    mesh = fsdp_mesh(meshes, bf16=bf16)
    if mesh is not None:
        apply_fsdp(part, mesh, zero=meshes.plan.zero, ignored=ignored, bf16=bf16, pipelined=meshes.plan.pp > 1)
    return part

