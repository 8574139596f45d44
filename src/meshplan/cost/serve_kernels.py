"""The kernels a serving engine's step runs: fused ones (or the runtime decoder's eager ops), the routed experts
a decode step touches, and the small kernels every layer launches besides its GEMMs and attention."""

from __future__ import annotations

from dataclasses import replace

from meshplan.cost.ops import Gemm, small_kernels
from meshplan.spec.engine import EngineProfile
from meshplan.spec.framework import FrameworkProfile
from meshplan.spec.model import LayerSpec

SERVING_KERNELS = FrameworkProfile(name="serving-kernels", fused_kernels=True, flash_attention=True)
"""Engines run fused kernels and flash/paged attention (FlashAttention, FlashInfer, TRT-LLM XQA)."""


def kernels(engine: EngineProfile) -> FrameworkProfile:
    """The kernels an engine runs: its ``kernel_stack`` profile (the runtime's eager ops), else fused ones."""
    if not engine.kernel_stack:
        return SERVING_KERNELS
    from meshplan import catalog

    return catalog.framework(engine.kernel_stack)


def experts_touched(n_local: int, n_experts: int, top_k: int, tokens: int) -> float:
    """Local experts that receive at least one of ``tokens`` tokens under uniform top-k routing:
    n_local (1 - (1 - k/E)^T) (each expert is missed by a token with probability 1 - k/E); a decode step reads
    only these experts' weights."""
    return n_local * (1.0 - (1.0 - top_k / n_experts) ** max(tokens, 0))


def step_gemms(engine: EngineProfile, layer: LayerSpec, gemms: list[Gemm], tokens: int) -> list[Gemm]:
    """The layer's GEMMs with routed experts cut to those a step of ``tokens`` tokens touches (their rows
    spread over them), so a small decode batch reads a few experts, not all. Engines with fused kernels run each
    expert GEMM of a layer as one kernel over every expert (vLLM and SGLang ``fused_moe`` Triton kernels,
    TensorRT-LLM's MoE plugin), so its launch floor is one kernel, not one per expert."""
    moe = layer.moe
    if moe is None:
        return gemms
    fused = kernels(engine).fused_kernels
    out = []
    for g in gemms:
        if g.name.startswith("expert_") and g.count > 1:
            hit = max(experts_touched(g.count, moe.n_experts, moe.top_k, tokens), 1.0)
            rows = max(int(round(g.m * g.count / hit)), 1)
            g = replace(g, m=rows, count=max(int(round(hit)), 1), launches=1 if fused else 0)
        out.append(g)
    return out


MOE_ROUTER_KERNELS = 3
"""Kernels of a fused MoE layer besides its expert GEMMs and activation: top-k softmax, moe_align_block_size and
the sum over the chosen experts (vllm model_executor/layers/fused_moe/fused_moe.py, SGLang's copy of it)."""


MLA_ABSORB_KERNELS = 5
"""Kernels an MLA layer's absorbed decode path adds to a standard attention layer's: the q_a and kv_a RMSNorms, the
two copies that assemble the absorbed query and key, and the second of the two BMMs that stand in for kv_up
(sgl-project/sglang python/sglang/srt/models/deepseek_v2.py ``forward_absorb``)."""


def engine_small_kernels(layer: LayerSpec) -> int:
    """Kernels of a GPU engine's layer besides its GEMMs and attention: its fused norms, activation, residual adds
    and RoPE (``ops.small_kernels``), a MoE layer's router (``MOE_ROUTER_KERNELS``) and an MLA layer's absorbed
    path (``MLA_ABSORB_KERNELS``)."""
    mla = layer.attention is not None and layer.attention.kind == "mla"
    return small_kernels(layer, fused=True) + (MOE_ROUTER_KERNELS if layer.moe else 0) + (
        MLA_ABSORB_KERNELS if mla else 0)
