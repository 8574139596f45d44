"""Per-layer and per-stage costs: compute, exposed TP/CP/EP communication, recompute, activations.

Everything is per micro-batch on one rank of a virtual stage; the pipeline layer (closed form or simulator)
turns it into a step.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.cost.comm import Links, collective_time
from meshplan.cost.compute import gemm_time, host_excess, layer_compute, memory_time
from meshplan.cost.memory import act_bytes_per_token, layer_params, layer_recompute_mode
from meshplan.cost.ops import Gemm, LayerOps, layer_ops, rope_elements
from meshplan.spec.calibration import Calibration
from meshplan.spec.framework import FrameworkProfile
from meshplan.spec.hardware import GPUSpec
from meshplan.spec.model import BlockSpec, LayerSpec, ModelSpec
from meshplan.spec.plan import Plan


@dataclass(frozen=True, kw_only=True)
class Ctx:
    """What every per-layer cost function needs, passed explicitly."""

    model: ModelSpec
    """The model."""
    plan: Plan
    """The layout."""
    stack: FrameworkProfile
    """The software stack that runs it."""
    gpu: GPUSpec
    """The GPU running this stage."""
    links: Links
    """Process-group links for this stage's pool."""
    calib: Calibration
    """Constants of the GPU's generation."""


@dataclass(frozen=True, kw_only=True)
class LayerCost:
    """One layer, one micro-batch, one rank (s and bytes)."""

    fwd: float
    """Forward compute (s)."""
    bwd_input: float
    """Input-gradient compute, recompute included (s)."""
    bwd_weight: float
    """Weight-gradient compute (s)."""
    recompute: float
    """Recompute part of bwd_input (s)."""
    tp_f: float
    """Exposed TP/SP communication in the forward (s)."""
    tp_b: float
    """Exposed TP/SP communication in the backward, recomputed forward included (s)."""
    cp_f: float
    """Exposed context-parallel communication, forward (s)."""
    cp_b: float
    """Exposed context-parallel communication, backward (s)."""
    ep_f: float
    """Exposed expert all-to-all, forward (s)."""
    ep_b: float
    """Exposed expert all-to-all, backward (s)."""
    act_bytes: float
    """Activations kept for backward (bytes)."""
    full_act_bytes: float
    """Activations of the layer without recompute (live while it is recomputed) (bytes)."""
    n_params: int = 0
    """Parameter tensors of the layer."""
    host_wait: float = 0.0
    """Part of fwd + bwd the device waits for the host to issue the layer's ops (s)."""

    @property
    def forward(self) -> float:
        """Forward compute with its exposed TP/CP/EP communication (s)."""
        return self.fwd + self.tp_f + self.cp_f + self.ep_f

    @property
    def backward_input(self) -> float:
        """Input-gradient pass with its exposed communication, recompute included (s)."""
        return self.bwd_input + self.tp_b + self.cp_b + self.ep_b

    @property
    def work(self) -> float:
        """Everything the layer takes per micro-batch: forward, input and weight gradients (s)."""
        return self.forward + self.backward_input + self.bwd_weight


def tokens_of(block: BlockSpec, plan: Plan) -> int:
    """Tokens of one micro-batch that a rank of this block processes (the sequence is split by cp)."""
    per_sample = block.tokens or plan.seq_len
    return max(plan.micro_batch * per_sample // plan.cp, 1)


def _overlapped(comm: float, compute: float, *, overlap: bool, chunks: int, calib: Calibration) -> float:
    """Exposed part of a collective pipelined against ``compute``: with overlap, the first of ``chunks``
    pieces cannot hide and the rest hide up to overlap_eff of the compute; without, all of it shows."""
    if not overlap or comm <= 0:
        return comm
    return max(comm - calib.overlap_eff * compute, comm / max(chunks, 1))


def tp_comm(layer: LayerSpec, ops: LayerOps, ctx: Ctx, *, fwd_gemm: float, bwd_gemm: float) -> tuple[float, float]:
    """Exposed TP time (forward, backward) of one layer. Megatron TP (Shoeybi et al. 2019): one all-reduce
    after attention and one after the FFN, each way; with SP each becomes all-gather + reduce-scatter
    (Korthikanti et al. 2022, sec. 4.2.2), the same bytes in the ring model."""
    plan = ctx.plan
    if plan.tp <= 1:
        return 0.0, 0.0
    n = int(layer.attention is not None) + int(layer.moe is None or plan.etp > 1)
    msg = ops.tokens * layer.hidden * plan.act_bytes
    one = collective_time("all_reduce", msg, size=plan.tp, link=ctx.links.tp, calib=ctx.calib)
    one_f = one
    if plan.sp and plan.precision == "fp8" and ctx.stack.fp8_linear != "none":
        # The fp8 input is gathered, 1 byte/element: Transformer Engine quantizes the norm output first
        # (pytorch/module/layernorm_linear.py: gather_along_first_dim of the fp8 ln_out), torchao casts the
        # column-parallel input (float8/float8_tensor_parallel.py PrepareFloat8ModuleInput, Float8ColwiseParallel);
        # the reduce-scatter after the row-parallel GEMM stays 16-bit.
        one_f = (collective_time("all_gather", msg / plan.act_bytes, size=plan.tp, link=ctx.links.tp, calib=ctx.calib)
                 + collective_time("reduce_scatter", msg, size=plan.tp, link=ctx.links.tp, calib=ctx.calib))
    overlap = ctx.stack.tp_comm_overlap
    f = _overlapped(n * one_f, fwd_gemm, overlap=overlap, chunks=plan.tp, calib=ctx.calib)
    if ctx.stack.tp_backward_async and not overlap:
        b = _async_backward(n, msg, ctx, bwd_gemm=bwd_gemm, one=one)
    else:
        b = _overlapped(n * one, bwd_gemm, overlap=overlap, chunks=plan.tp, calib=ctx.calib)
    sync = (2 * n if plan.sp else n) * ctx.calib.sync_s  # host wake-up per blocking call (0 on GPUs)
    return f + sync, b + sync


def cp_comm(layer: LayerSpec, ops: LayerOps, ctx: Ctx, *, attn_fwd: float) -> tuple[float, float]:
    """Exposed context-parallel time (forward, backward) of one layer.

    Ring attention (Liu et al. 2023; Megatron CP): cp-1 steps each pass one K/V chunk to the next rank while
    the current chunk's attention runs; backward passes K/V and their gradients (twice the bytes) against
    2.5x the compute. All-to-all (Ulysses, Jacobs et al. 2023): q, k, v and the output cross the group, not
    overlapped.
    """
    plan, att = ctx.plan, layer.attention
    if plan.cp <= 1 or att is None:
        return 0.0, 0.0
    kv_heads = att.n_kv_heads if att.kind == "gqa" else att.n_heads
    if plan.cp_kind == "a2a":
        width = (att.n_heads * (att.qk_dim + att.v_dim) + kv_heads * att.qk_dim) / plan.tp
        t = collective_time("all_to_all", ops.tokens * width * plan.act_bytes, size=plan.cp, link=ctx.links.cp,
                            calib=ctx.calib)
        return t + ctx.calib.sync_s, t + ctx.calib.sync_s
    kv_bytes = ops.tokens * kv_heads * (att.qk_dim + att.v_dim) / plan.tp * plan.act_bytes
    step_f = collective_time("send_recv", kv_bytes, size=2, link=ctx.links.cp, calib=ctx.calib)
    step_b = collective_time("send_recv", 2 * kv_bytes, size=2, link=ctx.links.cp, calib=ctx.calib)
    per_f = attn_fwd / plan.cp
    exp_f = (plan.cp - 1) * max(step_f - ctx.calib.overlap_eff * per_f, 0.0)
    exp_b = (plan.cp - 1) * max(step_b - ctx.calib.overlap_eff * 2.5 * per_f, 0.0)
    sync = (plan.cp - 1) * ctx.calib.sync_s  # host wake-up per ring step (0 on GPUs)
    merge_f, merge_b = cp_step_merge(layer, ops, ctx)
    return exp_f + sync + merge_f, exp_b + sync + merge_b


def cp_step_merge(layer: LayerSpec, ops: LayerOps, ctx: Ctx) -> tuple[float, float]:
    """Memory time (forward, backward) of one layer's ring steps outside the attention kernel: each of the cp
    steps merges its partial output into the running one and accumulates the K/V gradients (the first step
    initialises them at about the same cost), at the stack's bytes per element
    (``FrameworkProfile.cp_step_bytes``: torch's ``_templated_ring_attention`` in fp32 with concatenations,
    Transformer Engine's fused 16-bit corrections)."""
    plan, att, stack = ctx.plan, layer.attention, ctx.stack
    out_f, out_b, kv_f, kv_b = stack.cp_step_bytes
    if plan.cp <= 1 or att is None or not any(stack.cp_step_bytes):
        return 0.0, 0.0
    kv_heads = att.n_kv_heads if att.kind == "gqa" and not stack.cp_repeats_kv else att.n_heads
    out = ops.tokens * att.n_heads / plan.tp * att.v_dim  # elements of the rank's attention output
    kv = ops.tokens * kv_heads / plan.tp * (att.qk_dim + att.v_dim)  # elements of its K and V chunks
    steps = plan.cp
    return (steps * memory_time(out_f * out + kv_f * kv, gpu=ctx.gpu, calib=ctx.calib),
            steps * memory_time(out_b * out + kv_b * kv, gpu=ctx.gpu, calib=ctx.calib))


def _async_backward(n: int, msg: float, ctx: Ctx, *, bwd_gemm: float, one: float) -> float:
    """Exposed backward TP time when the column-parallel layers' collectives run beside their GEMMs (Megatron
    ``LinearWithGradAccumulationAndAsyncCommunication``, Transformer Engine ``layernorm_linear.py`` backward
    ``async_op=True``): with SP, only the gather of the output gradient waits; the re-gather of the saved input
    (fp8 under Transformer Engine) hides behind the input-gradient GEMM and the input gradient's reduce-scatter
    behind the weight-gradient GEMM, each half of the layer's backward GEMMs; without SP the input gradient's
    all-reduce hides behind the weight-gradient GEMM."""
    plan = ctx.plan
    hide = ctx.calib.overlap_eff * bwd_gemm / (2 * n)  # one half's dgrad or wgrad GEMMs
    if not plan.sp:
        return n * max(one - hide, 0.0)
    fp8_input = plan.precision == "fp8" and ctx.stack.fp8_linear == "te"
    gather_in = collective_time("all_gather", msg / plan.act_bytes if fp8_input else msg, size=plan.tp,
                                link=ctx.links.tp, calib=ctx.calib)
    gather_grad = collective_time("all_gather", msg, size=plan.tp, link=ctx.links.tp, calib=ctx.calib)
    scatter = collective_time("reduce_scatter", msg, size=plan.tp, link=ctx.links.tp, calib=ctx.calib)
    return n * (gather_grad + max(gather_in - hide, 0.0) + max(scatter - hide, 0.0))


def ep_comm(layer: LayerSpec, ops: LayerOps, ctx: Ctx) -> float:
    """Expert all-to-all, forward + backward: dispatch and combine each way (GShard; Megatron alltoall
    dispatcher), local buffer = routed token copies x hidden, padded to capacity when set. Returns one
    direction (the backward moves the same bytes)."""
    plan, moe = ctx.plan, layer.moe
    if moe is None or plan.ep <= 1:
        return 0.0
    copies = ops.tokens / plan.tp * moe.top_k * (moe.capacity_factor or 1.0)
    one = collective_time("all_to_all", copies * layer.hidden * plan.act_bytes, size=plan.ep, link=ctx.links.ep,
                          calib=ctx.calib)
    return 2 * (one + ctx.calib.sync_s)  # sync_s: host wake-up per blocking call (0 on GPUs)


def layer_cost(block: BlockSpec, ctx: Ctx, *, index_on_rank: int) -> LayerCost:
    """Costs of one layer of ``block`` on one rank for one micro-batch."""
    plan, layer = ctx.plan, block.layer
    ops = layer_ops(layer, tokens=tokens_of(block, plan), plan=plan, stack=ctx.stack,
                    seq=block.tokens or plan.seq_len, dtype_bytes=plan.act_bytes)
    f, bi, bw = layer_compute(ops, gpu=ctx.gpu, calib=ctx.calib, dtype=plan.precision, sharded=plan.tp > 1)
    fwd_gemm = sum(gemm_time(g, gpu=ctx.gpu, calib=ctx.calib, dtype=plan.precision) for g in ops.gemms)
    host = ops.n_ops * (ctx.calib.op_overhead_s + (ctx.calib.dtensor_overhead_s if plan.tp > 1 else 0.0))
    attn_f = f - fwd_gemm - host - memory_time(ops.elementwise_bytes, gpu=ctx.gpu, calib=ctx.calib)
    attn_f = max(attn_f, 0.0)
    tp_f, tp_b = tp_comm(layer, ops, ctx, fwd_gemm=fwd_gemm, bwd_gemm=bi + bw - 2.5 * attn_f)
    cp_f, cp_b = cp_comm(layer, ops, ctx, attn_fwd=attn_f)
    mode = layer_recompute_mode(plan, index_on_rank)
    # Full recompute replays the whole forward, its TP/CP traffic included; selective replays the attention
    # core only (Korthikanti et al. 2022, sec. 5), or under torchtitan's per-op policy every other matmul and
    # every elementwise op (torchtitan parallelize: _save_list without every second mm).
    ew_f = memory_time(ops.elementwise_bytes, gpu=ctx.gpu, calib=ctx.calib)
    policy = ctx.stack.selective_policy
    if mode == "selective" and policy == "op":
        rec = fwd_gemm / 2 + ew_f
    elif mode == "selective" and policy == "mla_up_proj":
        rec = mla_up_proj_replay(layer, ops, ctx)
    else:
        rec = f if mode == "full" else (attn_f if mode == "selective" else 0.0)
    full = mode == "full"
    per_tok = act_bytes_per_token(layer, plan, ctx.stack, recompute=mode)
    full_tok = act_bytes_per_token(layer, plan, ctx.stack, recompute="none")
    ep = ep_comm(layer, ops, ctx)
    tp_b, cp_b, ep_b = tp_b + (tp_f if full else 0.0), cp_b + (cp_f if full else 0.0), ep + (ep if full else 0.0)
    wait_f, wait_b = host_excess(f + tp_f + cp_f + ep, bi + rec + bw + tp_b + cp_b + ep_b, ops.n_ops, ctx.calib,
                                 replayed=replayed_ops(layer, ops, mode, policy))
    # The backward's wait splits 3:1 between input and weight gradients, as its ops do (layer_compute's host term).
    f, bi, bw = f + wait_f, bi + 0.75 * wait_b, bw + 0.25 * wait_b
    return LayerCost(fwd=f, bwd_input=bi + rec, bwd_weight=bw, recompute=rec, tp_f=tp_f, tp_b=tp_b, cp_f=cp_f,
                     cp_b=cp_b, ep_f=ep, ep_b=ep_b, act_bytes=per_tok * ops.tokens,
                     full_act_bytes=full_tok * ops.tokens, n_params=ops.n_params, host_wait=wait_f + wait_b)


def replayed_ops(layer: LayerSpec, ops: LayerOps, mode: str, policy: str) -> int:
    """Ops a recompute issues again in the backward: the whole forward (full), the attention core (selective),
    every other weight GEMM and the elementwise ops (torchtitan's per-op policy), or the MLA up-projections
    and RoPE (``mla_up_proj``)."""
    if mode == "full":
        return ops.n_ops
    if mode != "selective" or layer.attention is None:
        return 0
    gemm_ops = sum(g.count for g in ops.gemms)
    if policy == "op":
        return ops.n_ops - gemm_ops + gemm_ops // 2
    if policy == "mla_up_proj":
        mla = layer.attention.kind == "mla"
        return sum(1 for g in ops.gemms if g.name in ("q_up", "q", "kv_up")) + 1 if mla else 0
    return 1  # the attention core: one fused kernel (flash attention), as op_count counts it


def mla_up_proj_replay(layer: LayerSpec, ops: LayerOps, ctx: Ctx) -> float:
    """Seconds Megatron's ``mla_up_proj`` recompute adds to a layer's backward: its forward of the query and
    key-value up-projections and of RoPE, run again (megatron/core/transformer/multi_latent_attention.py wraps
    ``qkv_up_proj_and_rope_apply`` in ``CheckpointWithoutOutput``); 0 for a layer without MLA."""
    att = layer.attention
    if att is None or att.kind != "mla":
        return 0.0
    plan = ctx.plan
    gemms = sum(gemm_time(g, gpu=ctx.gpu, calib=ctx.calib, dtype=plan.precision)
                for g in ops.gemms if g.name in ("q_up", "q", "kv_up"))
    rope = rope_elements(att, tokens=ops.tokens, tp=plan.tp) * plan.act_bytes
    return gemms + memory_time(rope, gpu=ctx.gpu, calib=ctx.calib)


def mtp_depth(model: ModelSpec) -> int:
    """Multi-token-prediction depths (DeepSeek-V3 sec. 2.2): layers of the model's ``mtp`` blocks, each of which
    ends in its own pass through the shared output head and loss."""
    return sum(b.n_layers for b in model.blocks if b.name == "mtp")


def head_cost(model: ModelSpec, ctx: Ctx) -> tuple[float, float]:
    """(forward, backward) seconds of the output head and cross-entropy on the last stage: the logits GEMM
    (and its two backward GEMMs) plus fp32 softmax traffic over the vocabulary (read/write ~10 bytes per
    logit each way), once for the main prediction and once per MTP depth (Megatron-Core
    MultiTokenPredictionBlock computes logits and loss per depth with the shared output layer)."""
    plan = ctx.plan
    heads = 1 + mtp_depth(model)
    tokens = max(plan.micro_batch * plan.seq_len // plan.cp, 1)
    g = Gemm(name="logits", m=tokens, n=model.vocab // plan.tp, k=model.hidden)
    dtype = "bf16" if plan.precision == "fp8" else plan.precision
    t = gemm_time(g, gpu=ctx.gpu, calib=ctx.calib, dtype=dtype)
    ce = memory_time(tokens * model.vocab / plan.tp * 10.0, gpu=ctx.gpu, calib=ctx.calib)
    return heads * (t + ce), heads * (2 * t + ce)


def embedding_params(model: ModelSpec, plan: Plan, *, first: bool, last: bool, mtp: bool = True) -> float:
    """Embedding and output-head parameters one rank holds, vocab-parallel over tp: the input embedding on the
    first stage, the output head on the last (one tensor when tied and both are on the rank), and with ``mtp`` the
    embedding copy an MTP module needs on a last stage that is not the first (Megatron-Core GPTModel builds the
    embedding where pre_process or mtp_process)."""
    copies = int(first) + int(last and (not model.tied_embeddings or not first))
    if mtp and last and not first and mtp_depth(model):
        copies += 1
    return copies * model.vocab * model.hidden / plan.tp


def stage_params(model: ModelSpec, layers: list[tuple[BlockSpec, int]], plan: Plan, *, first: bool,
                 last: bool) -> tuple[float, float]:
    """(dense, expert) parameters one rank of a virtual stage holds: layers sharded by tp (experts by
    ep x etp), the embedding on the first stage and the output head on the last (vocab-parallel over tp)."""
    dense = expert = 0.0
    counts: dict[int, list] = {}
    for block, _ in layers:
        counts.setdefault(id(block), [block, 0])[1] += 1
    for block, n in counts.values():
        d, e = layer_params(block.layer)
        dense += n * d / plan.tp
        expert += n * e / (plan.ep * plan.etp)
    dense += embedding_params(model, plan, first=first, last=last)
    return dense, expert
