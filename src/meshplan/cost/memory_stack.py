"""Memory a stack's own kernels and buffers add or save beside the generic model of ``cost.memory``: Transformer
Engine under fp8 (saved inputs in fp8, weight workspaces) and DeepSpeed ZeRO-3's gather and reduce buffers. Each
term reads the stack profile (``fp8_linear``, ``fp8_params``, ``sharding``) and cites the code it comes from."""

from __future__ import annotations

from meshplan.spec.framework import FrameworkProfile
from meshplan.spec.model import LayerSpec, ModelSpec
from meshplan.spec.plan import Plan

# DeepSpeed ZeRO-3 defaults (microsoft/DeepSpeed v0.5.0 deepspeed/runtime/zero/constants.py; unchanged in v0.16
# runtime/zero/config.py): reuse distance and live parameters 1e9 elements, prefetch bucket 5e7, reduce bucket 5e8.
DS_MAX_REUSE = 1e9
DS_PREFETCH = 5e7
DS_REDUCE_BUCKET = 5e8
DS_IPG_BUFFERS = 2
"""v0.5.0 stage3.py allocates ``buf_0`` and, with ``overlap_comm`` (stage 3's default), ``buf_1`` of
reduce_bucket_size elements each at every backward (v0.16 keeps one, plus a torch.cat copy while reducing)."""


def te_fp8(plan: Plan, stack: FrameworkProfile) -> bool:
    """The plan's linear layers run Transformer Engine's fp8 path."""
    return plan.precision == "fp8" and stack.fp8_linear == "te"


def fp8_weight_bytes(plan: Plan, stack: FrameworkProfile) -> float | None:
    """Bytes per layer weight held as the model's copy when the stack keeps fp8 weights (Megatron
    ``fp8_param_gather``: the parameter buffer is uint8, distributed_data_parallel.py), else None. FSDP-sharded
    weights stay 16-bit (NeMo turns fp8_param_gather off under FSDP, scripts/performance/utils.py:354)."""
    return 1.0 if te_fp8(plan, stack) and stack.fp8_params and plan.zero < 3 else None


def fp8_workspace_bytes(plan: Plan, stack: FrameworkProfile, generation: str) -> float:
    """Bytes per layer weight of TE's fp8 copies beside the model's weights. 16-bit weights: a cached fp8 copy
    kept across micro-batches, row-wise plus a transposed copy on Hopper, one copy on Blackwell, whose GEMMs take
    either layout (TE base.py ``_fp8_workspaces``; csrc/quantizer.cpp ``with_transpose = columnwise_usage &&
    !nvte_is_non_tn_fp8_gemm_supported()``). fp8 weights (``fp8_params``): only the transposed cache on Hopper."""
    if not te_fp8(plan, stack) or plan.zero >= 3:
        return 0.0
    hopper = generation == "hopper"
    if fp8_weight_bytes(plan, stack) is not None:
        return 1.0 if hopper else 0.0
    return 2.0 if hopper else 1.0


def fp8_saved_delta(layer: LayerSpec, plan: Plan, stack: FrameworkProfile) -> float:
    """Change in activation bytes per token of one layer when TE runs it in fp8 (TE module/linear.py and
    layernorm_linear.py: the weight-gradient input is saved quantized, one byte per element, and the 16-bit copy
    dropped): the QKV and FC1 inputs (LayerNormLinear's ln_out, the local shard under sequence parallelism) and
    the FC2 input (the activation output) halve; the output projection saves its own fp8 copy of the attention
    output, which flash attention keeps in 16 bits for its backward (+1 byte). Routed experts (TE GroupedLinear)
    save their dispatched inputs and activation outputs in fp8; the router's input stays 16-bit."""
    if not te_fp8(plan, stack):
        return 0.0
    tp, h = plan.tp, layer.hidden
    h_div = tp if plan.sp else 1
    delta = 0.0
    att = layer.attention
    if att is not None:
        delta += -h / h_div + att.n_heads * att.v_dim / tp
    if layer.moe is not None:
        moe = layer.moe
        delta -= moe.top_k / tp * (h + moe.expert_ffn_hidden)
        if moe.n_shared_experts:
            delta += h / h_div - moe.shared_width * moe.n_shared_experts / tp
    else:
        delta += -h / h_div - layer.ffn_hidden / tp
    return delta


def largest_linear(layer: LayerSpec, plan: Plan) -> float:
    """The largest weight tensor of one layer on a rank, which is also its largest module's parameters (each
    Megatron linear is a module with one weight): the fused QKV, output projection, fused FC1 or FC2 (a routed
    expert's FC1 for MoE) (count)."""
    h, tp = layer.hidden, plan.tp
    mats = []
    att = layer.attention
    if att is not None:
        mats += [h * (att.n_heads * att.qk_dim + att.n_kv_heads * (att.qk_dim + att.v_dim)) / tp,
                 att.n_heads * att.v_dim * h / tp]
    up = 2 if layer.gated else 1
    f = layer.moe.expert_ffn_hidden if layer.moe is not None else layer.ffn_hidden / tp
    mats += [up * h * f, f * h]
    return max(mats)


def deepspeed_zero3_bytes(model: ModelSpec, plan: Plan, *, unit: float) -> float:
    """DeepSpeed ZeRO-3's transient memory at a layer's backward (fp16/bf16, 2 bytes), whose gathers are per
    sub-module (v0.5.0 stage3.py fetch_sub_module: ``named_parameters(recurse=False)``), not per layer: the module
    computing, the prefetch bucket and what the reuse distance keeps gathered (up to 1e9 elements, the rest of
    the layer), the largest weight's full gradient before it is copied into a reduce bucket or reduced alone
    (``extra_large_param_to_reduce``), and the ipg reduce buffers. ``unit``: one layer's parameters on the rank."""
    largest = max((largest_linear(b.layer, plan) for b in model.blocks), default=0.0)
    live = largest + min(DS_MAX_REUSE, max(unit - largest, 0.0)) + DS_PREFETCH
    return 2.0 * live + 2.0 * largest + 2.0 * DS_IPG_BUFFERS * DS_REDUCE_BUCKET
