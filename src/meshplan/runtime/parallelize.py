"""Apply a plan's intra-stage parallelism to one model part: TP+SP (DTensor), activation checkpointing, FSDP2.

Order follows torchtitan: tensor parallel first (it rewrites parameters into DTensors on the tp axis), then
activation checkpointing, then fully_shard per block and on the part's root (FSDP shards what TP left).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleInputOutput,
                                               RowwiseParallel, SequenceParallel, parallelize_module)

from meshplan.runtime.mesh import Meshes
from meshplan.runtime.models.decoder import Decoder
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import Plan


def check_runtime_support(spec: ModelSpec, plan: Plan) -> list[str]:
    """What the runtime cannot run for this (model, plan), beyond plan_violations, as sentences."""
    out = []
    att = spec.decoder.attention
    if plan.tp > 1 and att is not None and att.n_kv_heads % plan.tp:
        out.append(f"tp={plan.tp} must divide the {att.n_kv_heads} kv heads (the runtime does not replicate kv heads)")
    if plan.tp > 1 and spec.position == "learned":
        out.append("tensor parallelism with learned position embeddings is not supported by the runtime")
    if plan.tp > 1 and spec.tied_embeddings:
        out.append("tensor parallelism with tied embeddings is not supported by the runtime")
    if plan.pp > 1 and spec.tied_embeddings:
        out.append("tied embeddings across pipeline stages are not supported by the runtime")
    if plan.ep > 1 and plan.dp % plan.ep:
        out.append(f"the runtime folds ep inside dp: ep={plan.ep} must divide dp={plan.dp}")
    if plan.ep > 1 and plan.tp > 1:
        out.append("the runtime does not combine expert parallelism with tensor parallelism")
    if plan.etp > 1:
        out.append(f"etp={plan.etp}: expert tensor parallelism is not supported by the runtime")
    if plan.cp > 1 and plan.cp_kind != "ring":
        out.append(f"cp_kind={plan.cp_kind}: the runtime implements ring context parallelism only")
    if plan.cp > 1 and spec.position == "learned":
        out.append("context parallelism with learned position embeddings is not supported by the runtime")
    return out


def _layer_tp_plan(block: nn.Module, sp: bool) -> dict:
    seq = Shard(1) if sp else Replicate()
    plan: dict = {
        "attention": PrepareModuleInput(input_layouts=(seq, None), desired_input_layouts=(Replicate(), None)),
        "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=seq),
    }
    if sp:
        plan["attention_norm"] = SequenceParallel()
        plan["ffn_norm"] = SequenceParallel()
    if hasattr(block, "moe"):
        # Experts stay whole on every tp rank (etp = 1): gather the sequence in, hand the sequence shard back.
        if sp:
            plan["moe"] = PrepareModuleInputOutput(input_layouts=(seq,), desired_input_layouts=(Replicate(),),
                                                   use_local_input=True, output_layouts=(Replicate(),),
                                                   desired_output_layouts=(Shard(1),))
        else:
            plan["moe"] = PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),),
                                             use_local_output=True)
    else:
        plan.update({
            "feed_forward": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w2": RowwiseParallel(output_layouts=seq),
        })
        if block.feed_forward.w3 is not None:
            plan["feed_forward.w3"] = ColwiseParallel()
    return plan


def apply_tp(part: Decoder, meshes: Meshes) -> None:
    """Megatron-style tensor parallelism with optional sequence parallelism, via DTensor parallelize_module."""
    sp = meshes.plan.sp
    seq = Shard(1) if sp else Replicate()
    top: dict = {}
    if part.tok_embeddings is not None and part.first:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    if part.last:
        if sp:
            top["norm"] = SequenceParallel()
        top["output"] = ColwiseParallel(input_layouts=seq, output_layouts=Replicate())
    # Between pipeline stages each tp rank passes its own local activations (the sequence shard under SP), so a
    # later stage needs no input redistribution.
    parallelize_module(part, meshes.tp, top)
    for block in part.layers.values():
        parallelize_module(block, meshes.tp, _layer_tp_plan(block, sp))


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


def apply_fsdp(part: Decoder, meshes: Meshes, *, ignored: set[nn.Parameter]) -> None:
    """FSDP2 per block and on the part: zero 3 reshards parameters after forward; zero 0/1/2 keep them gathered
    (gradients are still reduce-scattered, which is what ZeRO-1/2 amount to); HSDP when dp_replicate > 1."""
    mesh = meshes.fsdp
    reshard = meshes.plan.zero == 3
    for block in part.layers.values():
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard, ignored_params=ignored or None)
    fully_shard(part, mesh=mesh, reshard_after_forward=reshard, ignored_params=ignored or None)


def parallelize(part: Decoder, meshes: Meshes, *, ignored: set[nn.Parameter]) -> Decoder:
    """TP, recompute and FSDP as the plan asks, in that order; returns the same module."""
    if meshes.tp is not None:
        apply_tp(part, meshes)
    apply_recompute(part, meshes.plan)
    if meshes.fsdp is not None:
        apply_fsdp(part, meshes, ignored=ignored)
    return part

