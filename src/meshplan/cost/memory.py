"""Memory per rank: parameters, gradients and optimizer states after ZeRO sharding (Rajbhandari et al. 2020),
activations per layer for each recompute mode (Korthikanti et al. 2022, generalized to GQA, gated FFNs and
MoE), the schedule's in-flight micro-batches, logits, FSDP unsharded units and the CUDA context."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from meshplan.cost.memory_stack import deepspeed_zero3_bytes, fp8_saved_delta, fp8_weight_bytes, fp8_workspace_bytes
from meshplan.cost.result import MemoryBreakdown
from meshplan.spec.framework import FrameworkProfile
from meshplan.spec.model import LayerSpec, ModelSpec
from meshplan.spec.plan import Plan
from meshplan.spec.schedules import schedule_spec

GiB = 2**30


@lru_cache(maxsize=1024)
def layer_params(layer: LayerSpec) -> tuple[float, float]:
    """(dense, expert) parameter counts of one layer: attention, FFN or experts, norms, biases."""
    h = layer.hidden
    dense = 0.0
    att = layer.attention
    if att is not None:
        if att.kind == "mla":
            q = (h * att.q_lora_rank + att.q_lora_rank * att.n_heads * att.qk_dim) if att.q_lora_rank \
                else h * att.n_heads * att.qk_dim
            kv = h * (att.kv_lora_rank + att.qk_rope_head_dim) + \
                att.kv_lora_rank * att.n_heads * (att.head_dim + att.v_dim)
            dense += q + kv + att.n_heads * att.v_dim * h
        else:
            dense += h * (att.n_heads + 2 * att.n_kv_heads) * att.head_dim + att.n_heads * att.v_dim * h
        dense += 2 * h  # norm
    if layer.in_hidden and layer.in_hidden != h:
        dense += layer.in_hidden * h
    mats = 3 if layer.gated else 2
    expert = 0.0
    if layer.moe is not None:
        moe = layer.moe
        dense += h * moe.n_experts + mats * h * moe.shared_width * moe.n_shared_experts
        expert = moe.n_experts * mats * h * moe.expert_ffn_hidden
    else:
        dense += mats * h * layer.ffn_hidden
    dense += 2 * h  # second norm
    if layer.bias:
        dense += 4 * h + layer.ffn_hidden
    return dense, expert


def model_params(model: ModelSpec) -> float:
    """Total parameters, embeddings and output head included (counted once when tied)."""
    total = sum(sum(layer_params(b.layer)) * b.n_layers for b in model.blocks)
    emb = model.vocab * model.hidden
    return total + emb * (1 if model.tied_embeddings else 2)


def bytes_per_param(plan: Plan, stack: FrameworkProfile) -> tuple[float, float, float]:
    """(weights, grads, optimizer) bytes per parameter before sharding, mixed-precision Adam.

    ZeRO paper (Rajbhandari et al. 2020, sec. 3.1): 2 + 2 + 12 bytes (fp16 weights and grads; fp32 master,
    momentum, variance). Megatron-LM accumulates and reduces bf16 gradients in fp32 (4 bytes) unless
    the stack's ``grad_dtype`` is bf16; its precision-aware optimizer keeps the moments in bf16
    (``optimizer_dtype``: 2 + 2 instead of 4 + 4). FSDP2 (zero 3) keeps fp32 sharded parameters as the master
    copy, so weights 4 and optimizer the moments only; DeepSpeed's ZeRO-3 keeps the paper's 16-bit partition
    and fp32 master. A stack that keeps fp8 weights (``fp8_params``) holds 1 byte per weight.
    """
    moments = 4.0 if stack.optimizer_dtype == "bf16" else 8.0
    grads = 2.0 if stack.grad_dtype == "bf16" else 4.0
    if plan.precision == "fp32" or (plan.zero == 3 and stack.sharding != "deepspeed_zero"):
        return 4.0, grads, moments
    weights = fp8_weight_bytes(plan, stack) or 2.0
    return weights, 2.0 if plan.precision == "fp16" else grads, 4.0 + moments


def act_bytes_per_token(layer: LayerSpec, plan: Plan, stack: FrameworkProfile, *, recompute: str) -> float:
    """Activation bytes one token leaves on one rank for one layer's backward (16-bit activations).

    Korthikanti et al. 2022, eq. 1-2 and Table 2, generalized: attention stores its norm and QKV inputs (h),
    q/k/v ((a + 2g) d), the attention output (a d_v) and flash-attention's log-sum-exp (fp32 per head); the
    FFN stores its norm and fc1 inputs (h), fc1 outputs and the activation output. h-sized tensors shard over
    tp only with sequence parallelism. Selective recompute drops what only the attention core needs (with flash
    attention, its log-sum-exp); full recompute keeps only the layer input.
    """
    tp, h = plan.tp, layer.hidden
    h_div = tp if plan.sp else 1
    if recompute == "full":
        return 2.0 * h / h_div
    if recompute == "selective" and stack.selective_policy == "op" and layer.attention is not None \
            and layer.moe is None and layer.attention.kind == "gqa":
        # torchtitan per-op policy keeps the layer input, the outputs of every other matmul (q, v, fc1-gate,
        # fc2) and the attention output with its log-sum-exp.
        att = layer.attention
        kept = att.n_heads * att.head_dim + att.n_kv_heads * att.head_dim + layer.ffn_hidden + \
            att.n_heads * att.v_dim
        return 2.0 * h / h_div + 2.0 * h / h_div + 2.0 * kept / tp + 4.0 * att.n_heads / tp
    total = 0.0
    att = layer.attention
    if att is not None:
        up_proj = recompute == "selective" and stack.selective_policy == "mla_up_proj" and att.kind == "mla"
        # Fused attention takes grouped keys and values as they are (flash-attention 2, cuDNN: GQA without repeat).
        q_k_v = (att.n_heads * att.qk_dim + att.n_kv_heads * (att.qk_dim + att.v_dim)) if att.kind == "gqa" \
            else att.n_heads * (2 * att.qk_dim + att.v_dim) * (not up_proj) + att.kv_lora_rank + att.q_lora_rank
        total += 4.0 * h / h_div + 2.0 * q_k_v / tp + 2.0 * att.n_heads * att.v_dim / tp
        # mla_up_proj frees the up-projected q, k and v once the attention core has run and recomputes them for
        # its backward (Megatron MLA: CheckpointWithoutOutput.discard_output_and_register_recompute); the
        # compressed latents stay, and so does the core's log-sum-exp, which is not recomputed.
        if recompute != "selective" or up_proj:
            # Flash attention keeps only its fp32 log-sum-exp; the output is kept anyway as the input of the
            # output projection, so selective recompute frees just the statistics (measured by memcheck).
            # Unfused attention keeps its scores, softmax, dropout mask and output: 5 a s bytes per token
            # (Korthikanti et al. 2022, eq. 1), which is what selective recompute was made to drop.
            total += 4.0 * att.n_heads / tp if stack.flash_attention else \
                5.0 * att.n_heads * plan.seq_len / tp
    mats_up = 2 if layer.gated else 1
    total += 4.0 * h / h_div
    if layer.moe is not None:
        moe = layer.moe
        k_per_rank = moe.top_k / tp
        f = moe.expert_ffn_hidden
        # Dispatched inputs, fc1 outputs, activation outputs and combine inputs of each routed copy.
        total += k_per_rank * (2.0 * h + 2.0 * mats_up * f + 2.0 * f + 2.0 * h)
        if moe.n_shared_experts:
            fs = moe.shared_width * moe.n_shared_experts / tp
            total += 2.0 * mats_up * fs + 2.0 * fs
    else:
        f = layer.ffn_hidden / tp
        total += 2.0 * mats_up * f + 2.0 * f
    if stack.eager_dtensor:
        total += eager_extra_bytes(layer, plan)
    return total + fp8_saved_delta(layer, plan, stack)


def eager_extra_bytes(layer: LayerSpec, plan: Plan) -> float:
    """What eager PyTorch keeps beyond fused kernels, per token (measured by ``meshplan memcheck`` on the
    runtime's Llama layer, 181,384 vs 145,536 B/token for 8B): keys/values repeated to every query head before
    SDPA (GQA), SiLU's output beside the product (gated FFN), and RoPE's fp32 cos/sin."""
    tp, extra = plan.tp, 0.0
    att = layer.attention
    if plan.sp and tp > 1:
        # DTensor ColwiseParallel saves its all-gathered (full-sequence) input for the weight gradient, where
        # Megatron's SP keeps the shard and gathers again in backward: the QKV and FC1 inputs, 2h each.
        extra += 2 * 2.0 * layer.hidden * (1 - 1 / tp)
    if att is not None and att.kind == "gqa":
        extra += 2.0 * (att.n_heads - att.n_kv_heads) * (att.qk_dim + att.v_dim) / tp + 8.0 * att.qk_dim
    if layer.gated and layer.moe is None:
        extra += 2.0 * layer.ffn_hidden / tp
    if layer.moe is not None:
        extra += moe_eager_extra_bytes(layer, plan)
    return extra


def moe_eager_extra_bytes(layer: LayerSpec, plan: Plan) -> float:
    """What the eager MoE keeps per token beyond the fused model's dispatched inputs, fc1/activation outputs
    and combine inputs (memcheck, Qwen3-30B-A3B ep 8: 230,500 B/token per layer): autograd's ``index_copy``
    and ``index_add`` save their source for ``expand_as`` in backward (derivatives.yaml), which keeps the
    experts' un-permuted outputs and the weighted combine (2 h each per routed copy); SiLU's output beside the
    product (gated experts, 2 f per copy); and the router's fp32 softmax over all experts (4 E)."""
    moe = layer.moe
    k_per_rank = moe.top_k / plan.tp
    f = moe.expert_ffn_hidden
    extra = k_per_rank * (2 * 2.0 * layer.hidden + (2.0 * f if layer.gated else 0.0))
    if layer.gated and moe.n_shared_experts:
        extra += 2.0 * moe.shared_width * moe.n_shared_experts / plan.tp
    return extra + 4.0 * moe.n_experts / plan.tp


def layer_recompute_mode(plan: Plan, index_on_rank: int) -> str:
    """Recompute mode of the rank's ``index_on_rank``-th layer: with ``recompute_layers`` N, only the first N
    layers of each pipeline rank are fully recomputed (Megatron's block method)."""
    if plan.recompute == "full" and plan.recompute_layers and index_on_rank >= plan.recompute_layers:
        return "none"
    return plan.recompute


def logits_bytes(model: ModelSpec, plan: Plan, stack: FrameworkProfile) -> float:
    """Output-layer memory on the last stage for one micro-batch at its loss backward (``stack.loss_kernel``).
    Megatron's fused vocab-parallel cross-entropy: 16-bit logits plus the fp32 softmax it keeps (6 bytes per
    logit). Eager ``F.cross_entropy`` on fp32 logits: the saved log-softmax, ``nll_loss_backward``'s gradient and
    ``_log_softmax_backward_data``'s output at once (12 bytes, memcheck). Under tensor parallelism torch's
    ``loss_parallel`` backward computes ``(zeros_like(x) + exp(x)) * grad`` beside the saved log-softmax:
    three fp32 temporaries, 16 bytes (torch.distributed.tensor.parallel.loss, memcheck tp 8)."""
    tokens = plan.micro_batch * plan.seq_len / plan.cp
    per_logit = 6.0 if stack.loss_kernel == "fused" else (16.0 if plan.tp > 1 else 12.0)
    return tokens * model.vocab / plan.tp * per_logit


def embedding_grad_bytes(model: ModelSpec, plan: Plan, stack: FrameworkProfile) -> float:
    """Gradient bytes of the input embedding beyond a vocabulary-sharded one while gradients accumulate over
    micro-batches. Eager DTensor has no row-sharded strategy for the embedding backward, so the vocab-parallel
    (RowwiseParallel) embedding's weight gradient comes back replicated over tp, and FSDP2's fp32 reduce dtype
    keeps it whole in fp32 until the last micro-batch reduces it: 4 V h (1 - 1/tp) more (memcheck, Llama-3.1-8B
    tp 8: 1.71 GiB). Megatron's VocabParallelEmbedding keeps its gradient sharded."""
    if not stack.eager_dtensor or plan.tp == 1 or plan.n_micro == 1:
        return 0.0
    return 4.0 * model.vocab * model.hidden * (1 - 1 / plan.tp)


def reserved_bytes(generation: str) -> float:
    """CUDA context, cuBLAS workspace and NCCL buffers (measured ~0.5 GiB context + ~0.5 GiB NCCL/cuBLAS on
    H100 with PyTorch 2.x); a CPU process reserves little."""
    return 0.1 * GiB if generation == "cpu" else 1.0 * GiB


@dataclass(frozen=True, kw_only=True)
class RankLoad:
    """What one pipeline rank holds, the inputs of its peak memory (``rank_memory``)."""

    dense: float
    """Dense parameters on the rank, tensor-parallel shard (count)."""
    expert: float
    """Expert parameters on the rank, expert-parallel shard (count)."""
    act: float
    """Activations saved by the schedule's in-flight micro-batches (bytes)."""
    act_one: float
    """Activations one micro-batch saves on the rank (bytes)."""
    recompute: float
    """What recomputing one layer in backward rebuilds beyond what it saved (bytes)."""
    root: float
    """Embedding and output-head parameters on the rank, FSDP's root unit (count)."""
    n_units: int
    """Layers on the rank, FSDP's units (count)."""
    first: bool
    """The rank holds the input embedding."""
    last: bool
    """The rank holds the output head and the loss."""


def sharded_state(plan: Plan, stack: FrameworkProfile, *, dense: float, expert: float) -> tuple[float, float, float]:
    """(weights, gradients, optimizer states) in bytes of ``dense`` and ``expert`` parameters after ZeRO sharding:
    stage 1 shards the optimizer states, 2 also the gradients, 3 also the weights (Rajbhandari et al. 2020 sec.
    5), dense ones over the ZeRO group and experts over their expert-data-parallel share of it."""
    w, g, o = bytes_per_param(plan, stack)

    def sharded(b: float, stage: int) -> float:
        on = plan.zero >= stage
        return dense * b / (plan.zero_group if on else 1) + expert * b / (plan.expert_zero_group if on else 1)
    return sharded(w, 3), sharded(g, 2), sharded(o, 1)


def holds_unsharded(plan: Plan) -> bool:
    """Under a pipeline with several micro-batches, FSDP keeps a unit unsharded (16-bit) from its forward to its
    backward (torchtitan's PP reshard policy; the runtime does the same)."""
    return plan.zero == 3 and plan.pp > 1 and plan.n_micro > 1


def frees_grads(plan: Plan, stack: FrameworkProfile) -> bool:
    """FSDP2 frees gradients between steps (zero_grad to None): ZeRO-3, and every ZeRO level of a stack whose
    sharding is FSDP2; Megatron's distributed optimizer keeps its gradient buffers, and DeepSpeed its gradient
    partition (stage3.py ``grads_in_partition``, allocated once)."""
    return (plan.zero == 3 and stack.sharding != "deepspeed_zero") or stack.sharding == "fsdp2"


def accumulates_unsharded(plan: Plan, stack: FrameworkProfile) -> bool:
    """FSDP2 gradients accumulate unsharded over no-sync micro-batches and are reduced after the last backward: a
    pipeline's (``holds_unsharded``), or a stack that skips gradient sync while accumulating."""
    return frees_grads(plan, stack) and plan.n_micro > 1 and (
        holds_unsharded(plan) or (stack.sharding == "fsdp2" and stack.accumulate_unsharded_grads))


def static_floor(plan: Plan, stack: FrameworkProfile, *, dense: float, expert: float) -> float:
    """Bytes a rank holding these parameters has at its peak whatever its schedule, split and recompute (the
    static part of ``rank_memory`` from below): sharded weights and optimizer states, the unsharded copy a
    pipeline keeps, and the sharded gradients unless FSDP2 may have none at the peak (one micro-batch, or
    unsharded accumulation whose gradients can take the place of activations)."""
    w, g, o = sharded_state(plan, stack, dense=dense, expert=expert)
    vanish = frees_grads(plan, stack) and (plan.n_micro == 1 or accumulates_unsharded(plan, stack))
    held = (dense + expert) * 2.0 if holds_unsharded(plan) else 0.0
    return w + o + held + (0.0 if vanish else g)


def rank_memory(model: ModelSpec, plan: Plan, stack: FrameworkProfile, load: RankLoad, *,
                generation: str) -> MemoryBreakdown:
    """Peak memory of one pipeline rank: weights, gradients and optimizer states after ZeRO sharding, the saved
    activations, and the larger of two transients that never meet: the logits at the loss backward, and the
    recomputed layer with FSDP's gathered units (and FSDP2's gradients where they outgrow the freed activations)
    during the layers' backward; the output layer consumes the loss gradient before the first layer's backward
    starts (memcheck, Llama-3.1-8B full recompute: 25.1 GiB, not the 26.7 a sum of both gives)."""
    params, grads, optimizer = sharded_state(plan, stack, dense=load.dense, expert=load.expert)
    optimizer *= 1 + plan.extra_state_copies  # peers' shards kept here (Plan.state_copies)
    held, late = holds_unsharded(plan), 0.0
    if held:
        params += (load.dense + load.expert) * 2.0
    if accumulates_unsharded(plan, stack):
        _, g, _ = bytes_per_param(plan, stack)
        upcast = 2.0 * largest_unit(model, plan, stack, load) if stack.eager_dtensor else 0.0
        grads, late = pipelined_grads(plan, unsharded=(load.dense + load.expert) * g, act=load.act,
                                      act_one=load.act_one, upcast=upcast)
    elif frees_grads(plan, stack) and plan.n_micro == 1:
        # None exist at the loss backward; during the layers' backward they only matter if they outgrow the
        # activations they replace.
        late, grads = max(grads - load.act, 0.0), 0.0
    params += saved_expert_copies(plan, stack, load) + fp8_weight_extra(plan, stack, load, generation)
    grads += embedding_grad_bytes(model, plan, stack) if load.first else 0.0
    units = 0.0 if held else zero3_buffers(model, plan, stack, load)
    logits = logits_bytes(model, plan, stack) if load.last else 0.0
    if logits < load.recompute + units + late:
        grads, buffers = grads + late, units
    else:
        buffers = logits - load.recompute
    return MemoryBreakdown(params=params, grads=grads, optimizer=optimizer, activations=load.act + load.recompute,
                           buffers=buffers, reserved=reserved_bytes(generation))


def saved_expert_copies(plan: Plan, stack: FrameworkProfile, load: RankLoad) -> float:
    """Eager experts stay out of FSDP's mixed precision: each layer's forward casts its local experts to 16 bits
    and saves the copy for its backward, one per in-flight micro-batch, except in fully recomputed layers, which
    drop it with their other activations (runtime moe._experts; memcheck, Qwen3-30B-A3B ep 8: 6.7 GiB) (bytes)."""
    if not stack.eager_dtensor or plan.precision not in ("bf16", "fp16") or not load.act_one or not load.n_units:
        return 0.0
    kept = load.n_units
    if plan.recompute == "full":
        kept = max(load.n_units - plan.recompute_layers, 0) if plan.recompute_layers else 0
    return 2.0 * load.expert * kept / load.n_units * load.act / load.act_one


def pipelined_grads(plan: Plan, *, unsharded: float, act: float, act_one: float,
                    upcast: float = 0.0) -> tuple[float, float]:
    """(beside the peak activations, beyond them at a backward's end) gradient bytes of a rank whose FSDP2 units
    accumulate unsharded fp32 gradients over no-sync micro-batches. They appear at the rank's first backward,
    which frees one micro-batch first, with ``upcast`` bytes beside them at its end (FSDP2's post-backward keeps
    a unit's 16-bit gradient while it is cast or added into fp32). When the schedule then runs another forward
    before the next backward (1F1B with more micro-batches than the rank holds in flight, always so on the last
    stage), the activations return to their peak beside them (memcheck, Llama-3.1-8B pp 4); GPipe runs no
    forward after its first backward."""
    inflight = act / act_one if act_one else 1.0
    steady = unsharded if not schedule_spec(plan.schedule_name).forwards_first and plan.n_micro > inflight else 0.0
    return steady, max(unsharded - act_one + upcast - steady, 0.0)


def largest_unit(model: ModelSpec, plan: Plan, stack: FrameworkProfile, load: RankLoad) -> float:
    """Parameters of the rank's largest FSDP unit's gradient: a layer, or the root (embedding and head), whose
    embedding gradient is whole over tp in eager DTensor (``embedding_grad_bytes``) (count)."""
    layer = (load.dense + load.expert - load.root) / max(load.n_units, 1)
    return max(layer, load.root + (embedding_grad_bytes(model, plan, stack) / 4.0 if load.first else 0.0))


def fp8_weight_extra(plan: Plan, stack: FrameworkProfile, load: RankLoad, generation: str) -> float:
    """Weight bytes beyond ``bytes_per_param`` under TE fp8: the workspaces of the layers' weights
    (``memory_stack.fp8_workspace_bytes``), and the embedding and output head, which stay 16-bit when the layers'
    weights are fp8 (fp8_model_init reaches only TE modules)."""
    layers = max(load.dense + load.expert - load.root, 0.0)
    extra = layers * fp8_workspace_bytes(plan, stack, generation)
    w8 = fp8_weight_bytes(plan, stack)
    return extra + (load.root * (2.0 - w8) if w8 is not None else 0.0)


def zero3_buffers(model: ModelSpec, plan: Plan, stack: FrameworkProfile, load: RankLoad) -> float:
    """ZeRO-3's transient parameter and gradient buffers during a layer's backward: DeepSpeed's per sub-module
    gathers and reduce buckets (``memory_stack.deepspeed_zero3_bytes``), or FSDP's whole units."""
    if plan.zero != 3 or not load.n_units:
        return 0.0
    if stack.sharding == "deepspeed_zero":
        return deepspeed_zero3_bytes(model, plan, unit=max(load.dense + load.expert - load.root, 0.0) / load.n_units)
    return fsdp_unit_bytes(plan, load)


def fsdp_unit_bytes(plan: Plan, load: RankLoad) -> float:
    """FSDP2 (zero 3) memory during a layer's backward: the unit computed and the one prefetched (16-bit each),
    the unit's fp32 gradients before reduce-scatter, and the root (embedding, head), gathered in 16 bits from
    the output layer's backward to the end (FSDP2; memcheck: 2.10 GB for 8B)."""
    if plan.zero != 3 or not load.n_units:
        return 0.0
    unit = max(load.dense + load.expert - load.root, 0.0) / load.n_units
    return unit * (2 * 2.0 + 4.0) + 2.0 * load.root
