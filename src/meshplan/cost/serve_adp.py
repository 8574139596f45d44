"""Attention data parallelism inside a serving replica (``ServePlan.attn_dp``): how one layer's work divides.

The replica's ``tp x attn_dp`` GPUs form ``attn_dp`` attention groups of ``tp``: each group runs the attention
projections and the KV cache of its own requests (MLA's latent is then stored once per group, not once per TP
rank), and before the feed-forward layer every group's hidden states are gathered so that all the replica's GPUs
run it on every token, experts over ``ep`` of them and each sliced over the rest, dense and shared experts
sliced over all; the outputs are reduce-scattered back to their groups. This is SGLang's data-parallel
attention (``--enable-dp-attention``: ``dp_gather`` / ``dp_scatter`` around the MoE,
python/sglang/srt/layers/dp_attention.py) and vLLM's data-parallel attention with expert parallelism, whose
default all-to-all backend is the same all-gather and reduce-scatter (``VLLM_ALL2ALL_BACKEND``
``allgather_reducescatter``, vllm/distributed/device_communicators/all2all.py).

Tokens spread evenly over the groups (each group's scheduler has its own token budget, and a steady state fills
each alike); the groups step together, as the gathered layer needs all of them. With ``attn_dp = 1`` both plans
are the replica's one TP plan and nothing here changes the step.
"""

from __future__ import annotations

from meshplan.cost.comm import collective_time, plan_links
from meshplan.spec.calibration import Calibration
from meshplan.spec.cluster import Pool
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import Plan
from meshplan.spec.serving import ServePlan

ATTENTION_GEMMS = frozenset({"q_down", "q_up", "q", "kv_down", "kv_up", "qkv", "proj", "in_proj"})
"""GEMMs an attention group runs on its own tokens (``ops.attention_gemms``); the others are the feed-forward
layer's, run on every group's tokens."""


def probes(model: ModelSpec, plan: ServePlan, seq: int) -> tuple[Plan, Plan]:
    """(attention group, feed-forward group) training plans whose per-rank GEMM shapes are the replica's: the
    attention over tp; the feed-forward layer over tp x attn_dp, experts over ep, each sliced over the rest. The
    training plan knows no 4-bit formats: NVFP4 takes fp8's path outside the GEMMs, int4 (weight-only) the 16-bit
    one (``serve_step.layer_parts`` gives the GEMMs their own dtype)."""
    prec = {"fp8": "fp8", "fp32": "fp32", "fp4": "fp8"}.get(plan.precision, "bf16")
    group = plan.moe_group
    ep = plan.ep if model.decoder.moe is not None else 1
    ffn = Plan(global_batch=1, seq_len=max(seq, 1), tp=group, ep=ep, etp=group // ep, precision=prec)
    if plan.attn_dp == 1:
        return ffn, ffn
    return Plan(global_batch=1, seq_len=max(seq, 1), tp=plan.tp, precision=prec), ffn


def group_tokens(plan: ServePlan, tokens: int) -> int:
    """Tokens of the busiest attention group when ``tokens`` spread evenly over them."""
    return -(-tokens // plan.attn_dp)


def gathered_ffn_time(plan: ServePlan, pool: Pool, calib: Calibration, *, ffn_plan: Plan, nbytes: float) -> float:
    """The all-gather of every group's ``nbytes`` of hidden states before the feed-forward layer and their
    reduce-scatter after it, over the replica's GPUs on the link their group spans."""
    link = plan_links(ffn_plan, pool).tp
    return sum(collective_time(kind, nbytes, size=plan.moe_group, link=link, calib=calib)
               for kind in ("all_gather", "reduce_scatter"))
