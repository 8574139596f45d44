"""The operations of one layer on one rank, for one micro-batch: GEMM shapes, attention-core FLOPs and
elementwise bytes, after tensor/sequence/context/expert partitioning.

Shapes are (M, N, K) with FLOPs = 2*M*N*K (one multiply-add = 2 FLOPs). The backward of a GEMM is two GEMMs
of the same FLOPs: input gradient (M x K x N) and weight gradient (K x N x M) (Narayanan et al. 2021, sec. 3.2).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from meshplan.spec.framework import FrameworkProfile
from meshplan.spec.model import AttentionSpec, LayerSpec
from meshplan.spec.plan import Plan


@dataclass(frozen=True, kw_only=True)
class Gemm:
    """One matrix multiply: out[M, N] = in[M, K] @ w[K, N]; ``count`` identical copies (e.g. local experts)."""

    name: str
    """Which projection (``qkv``, ``fc1``, ``expert_fc1``...)."""
    m: int
    """Rows: tokens on this rank."""
    n: int
    """Output columns."""
    k: int
    """Reduction dimension."""
    count: int = 1
    """Identical GEMMs run back to back (grouped experts)."""
    linear: bool = True
    """A weight GEMM (runs in fp8 under fp8 precision); False for activation-activation products."""
    grouped: bool = False
    """A routed-expert GEMM (grouped GEMM after token permutation)."""
    cast_pass: bool = False
    """Under fp8, the 16-bit input is cast by a kernel of its own (eager torchao); False when the cast is fused
    into the producing kernel (Transformer Engine's LayerNormLinear / fused activation, or torch.compile)."""
    launches: int = 0
    """Kernel launches of all copies (a fused MoE kernel runs every expert in one); 0 = one per copy."""

    @property
    def flops(self) -> float:
        """Forward FLOPs of all copies."""
        return 2.0 * self.m * self.n * self.k * self.count


@dataclass(frozen=True, kw_only=True)
class LayerOps:
    """Everything one layer computes on one rank for one micro-batch (forward direction)."""

    gemms: tuple[Gemm, ...]
    """Weight GEMMs."""
    attn_flops: float
    """Attention-core FLOPs (QK^T and AV), causal masking applied (FLOP)."""
    elementwise_bytes: float
    """HBM bytes moved by norms, activations, residuals, RoPE, router softmax (bytes)."""
    tokens: int
    """Tokens this rank's layer processes (after cp and, for h-sized tensors with sp, tp)."""
    n_ops: int = 0
    """Kernels one forward of the layer launches (GEMM copies, attention, norms, activation, residual adds,
    RoPE); the host-overhead model multiplies it."""
    n_params: int = 0
    """Parameter tensors of the layer (the optimizer launches a fixed number of ops per tensor)."""
    score_bytes: float = 0.0
    """Without flash attention: HBM bytes the materialized score matrix moves in the forward (bytes)."""


def attention_gemms(att: AttentionSpec, h: int, tokens: int, tp: int) -> list[Gemm]:
    """Projections of attention on a tp shard; GQA (Ainslie et al. 2023) or MLA (DeepSeek-V2, eq. 9-10)."""
    a = att.n_heads // tp
    if att.kind == "mla":
        out = []
        if att.q_lora_rank:
            out += [Gemm(name="q_down", m=tokens, n=att.q_lora_rank, k=h),
                    Gemm(name="q_up", m=tokens, n=a * att.qk_dim, k=att.q_lora_rank)]
        else:
            out.append(Gemm(name="q", m=tokens, n=a * att.qk_dim, k=h))
        out += [Gemm(name="kv_down", m=tokens, n=att.kv_lora_rank + att.qk_rope_head_dim, k=h),
                Gemm(name="kv_up", m=tokens, n=a * (att.head_dim + att.v_dim), k=att.kv_lora_rank)]
        return out + [Gemm(name="proj", m=tokens, n=h, k=a * att.v_dim)]
    g = max(att.n_kv_heads // tp, 1)
    return [Gemm(name="qkv", m=tokens, n=(a + 2 * g) * att.head_dim, k=h),
            Gemm(name="proj", m=tokens, n=h, k=a * att.v_dim)]


def attention_core_flops(att: AttentionSpec, *, tokens: int, kv_len: int, tp: int) -> float:
    """QK^T + AV FLOPs for ``tokens`` queries against ``kv_len`` keys; causal masking halves the work that
    flash-attention kernels compute (Dao 2023, sec. 3.1 block skipping)."""
    a = att.n_heads // tp
    full = 2.0 * tokens * kv_len * a * (att.qk_dim + att.v_dim)
    return full / 2 if att.causal else full


def mlp_gemms(layer: LayerSpec, *, tokens: int, tp: int) -> list[Gemm]:
    """Dense FFN: two matrices, three for gated activations (Shazeer 2020, GLU variants)."""
    f = layer.ffn_hidden // tp
    up = 2 * f if layer.gated else f
    return [Gemm(name="fc1", m=tokens, n=up, k=layer.hidden), Gemm(name="fc2", m=tokens, n=layer.hidden, k=f)]


def moe_gemms(layer: LayerSpec, *, tokens: int, plan: Plan) -> list[Gemm]:
    """Router plus local experts. Tokens per expert assume balanced routing (dropless, or padded to capacity
    when capacity_factor > 0, as GShard's capacity padding does, Lepikhin et al. 2020 sec. 2.2)."""
    moe = layer.moe
    assert moe is not None
    local_experts = moe.n_experts // plan.ep
    # Tokens enter the dispatcher sequence-sharded over tp (Megatron MoE); balanced routing gives each local
    # expert tokens/tp * top_k / n_experts tokens from each of the ep ranks, all-gathered over etp.
    per_expert = tokens / plan.tp * moe.top_k / moe.n_experts * plan.ep * plan.etp
    if moe.capacity_factor > 0:
        per_expert *= moe.capacity_factor
    f = moe.expert_ffn_hidden // plan.etp
    up = 2 * f if layer.gated else f
    m = max(int(round(per_expert)), 1)
    gemms = [Gemm(name="router", m=tokens, n=moe.n_experts, k=layer.hidden),
             Gemm(name="expert_fc1", m=m, n=up, k=layer.hidden, count=local_experts, grouped=True),
             Gemm(name="expert_fc2", m=m, n=layer.hidden, k=f, count=local_experts, grouped=True)]
    if moe.n_shared_experts:
        fs = moe.shared_width * moe.n_shared_experts // plan.tp
        gemms += [Gemm(name="shared_fc1", m=tokens, n=2 * fs if layer.gated else fs, k=layer.hidden),
                  Gemm(name="shared_fc2", m=tokens, n=layer.hidden, k=fs)]
    return gemms


def elementwise_bytes(layer: LayerSpec, *, tokens: int, plan: Plan, dtype_bytes: float, fused: bool = True) -> float:
    """HBM traffic of the memory-bound ops of one layer forward: two norms and two residual adds on h-sized
    tensors (sharded by tp under sp), the activation function on the FFN width, RoPE on q and k.
    Each op reads its inputs and writes its output once (fused kernels, as Megatron/TE and torch.compile do)."""
    tp = plan.tp
    h_tok = tokens / tp if plan.sp else tokens
    hidden_traffic = h_tok * layer.hidden * (2 * 2 + 2 * 3)  # 2 norms (r+w), 2 residual adds (2r+w)
    if layer.moe is not None:
        width = layer.moe.expert_ffn_hidden * layer.moe.top_k / max(plan.etp, 1)
    else:
        width = layer.ffn_hidden / tp
    act = tokens * width * (3 if layer.gated else 2)  # gated: read gate+up, write; else read, write
    rope = rope_elements(layer.attention, tokens=tokens, tp=tp) if layer.attention is not None else 0.0
    # Eager PyTorch runs each norm, activation and RoPE as several kernels (RMSNorm ~6 passes instead of 2,
    # SiLU-and-multiply 5 instead of 3, complex RoPE ~4 instead of 2): about 2.5x the fused traffic.
    unfused = 1.0 if fused else 2.5
    return (hidden_traffic + act + rope) * dtype_bytes * unfused


def rope_elements(att: AttentionSpec, *, tokens: int, tp: int) -> float:
    """Elements RoPE reads and writes in one forward on a tp shard: q and k, read once and written once
    (a fused rotary kernel, Su et al. 2021 eq. 34 applied in place)."""
    return tokens * 2 * (att.n_heads + att.n_kv_heads) / tp * att.head_dim


def score_traffic(att: AttentionSpec, *, tokens: int, kv_len: int, tp: int) -> float:
    """Forward HBM bytes of unfused attention's score matrix per rank: write QK^T, read it for the fused
    scale-mask-softmax and write the probabilities, dropout's 1-byte mask and output, read by AV (16-bit
    scores: ~11 bytes per score; Megatron-LM's fused softmax kernels, Korthikanti et al. 2022 sec. 4.1 count
    the same tensors). The full matrix is computed and then masked, causal or not."""
    return 11.0 * tokens * kv_len * att.n_heads / tp


def op_count(layer: LayerSpec, gemms: list[Gemm], *, fused: bool, fp8: bool = False) -> int:
    """Kernels of one layer's forward. Fused (TE, torch.compile): one per norm, activation, residual add and
    RoPE; eager PyTorch: RMSNorm ~6 ops (pow, mean, add, rsqrt, mul, mul), SiLU-and-multiply 2, complex RoPE
    ~4 per tensor (counted from the eager decompositions). Under fp8 every weight GEMM copy adds one host op:
    a Transformer Engine linear quantizes its input, and GroupedLinear fetches each expert's fp8 weight
    workspace in a Python loop, every micro-batch (module/grouped_linear.py, get_weight_workspace)."""
    n = sum(g.count for g in gemms) + (1 if layer.attention is not None else 0)
    if fp8:
        n += sum(g.count for g in gemms if g.linear)
    return n + small_kernels(layer, fused=fused)


def small_kernels(layer: LayerSpec, *, fused: bool) -> int:
    """Kernels of one layer's norms, activation, residual adds and RoPE (``op_count``): fused, one each (two
    norms, one activation, two adds, RoPE on q and k); eager, their decompositions."""
    if fused:
        return 2 + 1 + 2 + (2 if layer.attention is not None else 0)
    return 2 * 6 + 2 + 2 + (8 if layer.attention is not None else 0)


def layer_ops(layer: LayerSpec, *, tokens: int, plan: Plan, stack: FrameworkProfile, seq: int = 0,
              dtype_bytes: float = 2.0) -> LayerOps:
    """All ops of one layer on one rank for ``tokens`` tokens of one micro-batch (already divided by cp), with the
    stack's kernels (fused or eager, flash attention or not); ``seq`` is the full per-sample sequence each query
    attends over (0 = plan.seq_len)."""
    tp = plan.tp
    gemms: list[Gemm] = []
    attn = score_bytes = 0.0
    if layer.attention is not None:
        gemms += attention_gemms(layer.attention, layer.hidden, tokens, tp)
        # Ring/all-to-all context parallel: each rank's queries meet all cp chunks of keys once.
        att_spec = layer.attention if stack.flash_attention else replace(layer.attention, causal=False)
        attn = attention_core_flops(att_spec, tokens=tokens, kv_len=seq or plan.seq_len, tp=tp)
        if not stack.flash_attention:
            score_bytes = score_traffic(layer.attention, tokens=tokens, kv_len=seq or plan.seq_len, tp=tp)
    if layer.in_hidden and layer.in_hidden != layer.hidden:
        gemms.append(Gemm(name="in_proj", m=tokens, n=layer.hidden // tp, k=layer.in_hidden))
    gemms += moe_gemms(layer, tokens=tokens, plan=plan) if layer.moe else mlp_gemms(layer, tokens=tokens, tp=tp)
    if not stack.fused_kernels:
        gemms = [replace(g, cast_pass=True) for g in gemms]
    return LayerOps(gemms=tuple(gemms), attn_flops=attn, tokens=tokens,
                    n_ops=op_count(layer, gemms, fused=stack.fused_kernels, fp8=plan.precision == "fp8"),
                    n_params=len(gemms) + 2 + (4 if layer.bias else 0), score_bytes=score_bytes,
                    elementwise_bytes=elementwise_bytes(layer, tokens=tokens, plan=plan, dtype_bytes=dtype_bytes,
                                                        fused=stack.fused_kernels))
