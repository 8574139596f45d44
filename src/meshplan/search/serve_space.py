"""The serving search's layout space: the TP, PP, EP and attention-data-parallel degrees an engine accepts for a
model on a pool of GPUs, and the running-sequence caps tried below the engine's own."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from meshplan.spec.cluster import Pool
from meshplan.spec.engine import EngineProfile
from meshplan.spec.model import ModelSpec

if TYPE_CHECKING:
    from meshplan.search.serve_request import ServeRequest

SEQ_CAPS = (256, 128, 64, 32)
"""Running-sequence caps tried below the engine's default (a lower cap trades TTFT for TPOT)."""


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def tp_options(model: ModelSpec, pool: Pool, pinned: int) -> list[int]:
    """TP degrees an engine accepts: inside one node, dividing the attention heads, and the KV heads dividing
    tp or tp dividing them (vLLM ``verify_with_parallel_config``; replicated KV heads beyond n_kv)."""
    att = model.decoder.attention
    out = []
    for tp in _divisors(min(pool.gpus_per_node, pool.n_gpus)):
        if att is not None and att.n_heads % tp:
            continue
        if att is not None and att.kind != "mla" and att.n_kv_heads % tp and tp % att.n_kv_heads:
            continue
        out.append(tp)
    return [t for t in out if t == pinned] if pinned else out


def pp_options(model: ModelSpec, n_gpus: int, tp: int, pinned: int, most: int = 0) -> list[int]:
    """Pipeline stages: powers of two up to the GPUs left by tp, the layer count and the engine's ``most``
    (``EngineProfile.max_pp``, 0 = any)."""
    n_layers = sum(1 for _ in model.layers())
    opts = [p for p in (1, 2, 4, 8, 16) if p * tp <= n_gpus and p <= n_layers and (not most or p <= most)]
    return [p for p in opts if p == pinned] if pinned else opts


def ep_options(model: ModelSpec, tp: int, pinned: int) -> list[int]:
    """Expert parallelism inside a group of ``tp`` GPUs that run the experts together (1, or every rank whole
    experts when they divide)."""
    moe = model.decoder.moe
    opts = [1] if moe is None else sorted({1, tp} if moe.n_experts % tp == 0 else {1})
    return [e for e in opts if e == pinned] if pinned else opts


def serve_tps(req: ServeRequest) -> list[int]:
    """TP degrees of a replica: the model's, and a draft model's too (it runs at the same tp)."""
    opts = tp_options(req.model, req.pool, req.tp)
    draft = req.speculation.draft if req.speculation is not None else None
    return [t for t in opts if t in tp_options(draft, req.pool, 0)] if draft is not None else opts


def group_options(req: ServeRequest, tp: int, pp: int) -> list[tuple[int, int]]:
    """(attn_dp, ep) of a replica of ``tp`` x ``pp``: attention over the TP group with its experts inside it, or,
    for a MoE model on an engine that runs it (``EngineProfile.attention_dp``), attention data-parallel over
    2, 4, ... groups of tp inside one node, the experts over all of them (pinned values only, when given)."""
    out = [(1, ep) for ep in ep_options(req.model, tp, req.ep)] if req.attn_dp <= 1 else []
    most = req.engine.attention_dp_tp
    spec = req.speculation
    refused = spec is not None and spec.method in req.engine.speculative_no_adp  # the engine's drafter rule
    if req.model.decoder.moe is None or not req.engine.attention_dp or pp > 1 or (most and tp > most) or refused:
        return out
    d = 2
    while tp * d <= min(req.pool.gpus_per_node, req.pool.n_gpus):
        if not req.attn_dp or d == req.attn_dp:
            out += [(d, ep) for ep in ep_options(req.model, tp * d, req.ep)]
        d *= 2
    return out


def engine_options(req: ServeRequest) -> list[EngineProfile]:
    """The engine as profiled, and with lower running-sequence caps (a pinned cap is the only one)."""
    if req.max_num_seqs:
        return [replace(req.engine, max_num_seqs=req.max_num_seqs)]
    if not req.engine.seq_cap_settable:
        return [req.engine]
    caps = [c for c in SEQ_CAPS if c < req.engine.max_num_seqs]
    if req.work.concurrency:
        caps = [c for c in caps if c < req.work.concurrency]  # a cap above the load changes nothing
    return [req.engine, *(replace(req.engine, max_num_seqs=c) for c in caps)]
