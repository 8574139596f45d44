"""Memory per rank: parameters, gradients and optimizer states after ZeRO sharding (Rajbhandari et al. 2020),
activations per layer for each recompute mode (Korthikanti et al. 2022, generalized to GQA, gated FFNs and
MoE), the schedule's in-flight micro-batches, logits, FSDP unsharded units and the CUDA context."""

from __future__ import annotations

from functools import lru_cache

from meshplan.spec.model import LayerSpec, ModelSpec
from meshplan.spec.plan import Plan

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


def active_params(model: ModelSpec) -> float:
    """Parameters one token touches (dense + top-k experts), embeddings excluded (for 6N FLOP counts)."""
    total = 0.0
    for b in model.blocks:
        dense, expert = layer_params(b.layer)
        if b.layer.moe is not None:
            expert *= b.layer.moe.top_k / b.layer.moe.n_experts
        total += (dense + expert) * b.n_layers
    return total + model.vocab * model.hidden


def bytes_per_param(plan: Plan) -> tuple[float, float, float]:
    """(weights, grads, optimizer) bytes per parameter before sharding, mixed-precision Adam.

    ZeRO paper (Rajbhandari et al. 2020, sec. 3.1): 2 + 2 + 12 bytes (fp16 weights and grads; fp32 master,
    momentum, variance). Megatron-LM accumulates and reduces bf16 gradients in fp32 (4 bytes); FSDP2
    (zero 3) keeps fp32 sharded parameters as the master copy, so weights 4 and optimizer 8.
    """
    if plan.precision == "fp32":
        return 4.0, 4.0, 8.0
    if plan.zero == 3:
        return 4.0, 4.0, 8.0
    grads = 2.0 if plan.precision == "fp16" else 4.0
    return 2.0, grads, 12.0


def act_bytes_per_token(layer: LayerSpec, plan: Plan, *, recompute: str) -> float:
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
    if recompute == "selective" and plan.selective_policy == "op" and layer.attention is not None \
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
        q_k_v = (att.n_heads * (att.qk_dim + att.v_dim) + att.n_kv_heads * att.qk_dim) if att.kind == "gqa" \
            else att.n_heads * (2 * att.qk_dim + att.v_dim) + att.kv_lora_rank + att.q_lora_rank
        total += 4.0 * h / h_div + 2.0 * q_k_v / tp + 2.0 * att.n_heads * att.v_dim / tp
        if recompute != "selective":
            # Flash attention keeps only its fp32 log-sum-exp; the output is kept anyway as the input of the
            # output projection, so selective recompute frees just the statistics (measured by memcheck).
            # Unfused attention keeps its scores, softmax, dropout mask and output: 5 a s bytes per token
            # (Korthikanti et al. 2022, eq. 1), which is what selective recompute was made to drop.
            total += 4.0 * att.n_heads / tp if plan.flash_attention else \
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
    if not plan.fused_kernels:
        total += eager_extra_bytes(layer, plan)
    return total


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
        extra += 2.0 * (att.n_heads - att.n_kv_heads) * att.qk_dim / tp + 8.0 * att.qk_dim
    if layer.gated and layer.moe is None:
        extra += 2.0 * layer.ffn_hidden / tp
    return extra


def layer_recompute_mode(plan: Plan, index_on_rank: int) -> str:
    """Recompute mode of the rank's ``index_on_rank``-th layer: with ``recompute_layers`` N, only the first N
    layers of each pipeline rank are fully recomputed (Megatron's block method)."""
    if plan.recompute == "full" and plan.recompute_layers and index_on_rank >= plan.recompute_layers:
        return "none"
    return plan.recompute


def logits_bytes(model: ModelSpec, plan: Plan) -> float:
    """Transient output-layer memory on the last stage for one micro-batch: 16-bit logits plus the fp32
    softmax that vocab-parallel cross-entropy keeps for backward (6 bytes per logit); eager PyTorch also holds
    the fp32 gradient of the log-softmax at the start of backward (10 bytes, measured by memcheck)."""
    tokens = plan.micro_batch * plan.seq_len / plan.cp
    return tokens * model.vocab / plan.tp * (6.0 if plan.fused_kernels else 10.0)


def reserved_bytes(generation: str) -> float:
    """CUDA context, cuBLAS workspace and NCCL buffers (measured ~0.5 GiB context + ~0.5 GiB NCCL/cuBLAS on
    H100 with PyTorch 2.x); a CPU process reserves little."""
    return 0.1 * GiB if generation == "cpu" else 1.0 * GiB
