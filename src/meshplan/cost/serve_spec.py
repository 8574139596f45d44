"""Speculative decoding on the step model (``spec.speculation``): a decode pass verifies ``k + 1`` tokens of
every running sequence in one forward (its GEMMs on ``k + 1`` rows per sequence, its KV read once, as a query of
``k + 1`` tokens reads it: FlashAttention/FlashInfer decode with several queries per sequence), after the drafter
has proposed the ``k``; the pass yields ``Speculation.tokens_per_pass`` tokens per sequence on average.

A draft token costs, per ``SPEC_METHODS``: MTP and EAGLE, one decode step of their one layer (its own KV cache of
one layer) plus the model's output head, for every running sequence; a draft model, one decode step of that
model; n-gram lookup, nothing on the GPUs.
"""

from __future__ import annotations

from dataclasses import replace

from meshplan.cost.serve_adp import group_tokens
from meshplan.cost.serve_step import StepContext, decode_time, head_time, layer_time
from meshplan.spec.speculation import draft_layer


def verify_rows(ctx: StepContext) -> int:
    """Tokens per running sequence one decode pass runs through the model: 1, or the k drafts and one more."""
    spec = ctx.plan.speculation
    return spec.verify_rows if spec is not None else 1


def tokens_per_pass(ctx: StepContext) -> float:
    """Tokens one decode pass yields per running sequence: 1, or the mean acceptance length."""
    spec = ctx.plan.speculation
    return spec.tokens_per_pass if spec is not None else 1.0


def draft_context(ctx: StepContext) -> StepContext:
    """The step context a separate draft model decodes in: the replica's GPUs, plan and engine, its own model."""
    spec = ctx.plan.speculation
    assert spec is not None and spec.draft is not None
    return replace(ctx, model=spec.draft, plan=replace(ctx.plan, speculation=None))


def draft_time(ctx: StepContext, *, batch: int, context: float) -> float:
    """Seconds the drafter takes to propose ``k`` tokens for each of ``batch`` running sequences of mean
    ``context`` cached tokens (0 without speculation, or with n-gram lookup on the host)."""
    spec = ctx.plan.speculation
    if spec is None or spec.method == "ngram" or batch <= 0:
        return 0.0
    if spec.method == "draft":
        return spec.draft_tokens * decode_time(draft_context(ctx), batch=batch, context=context)
    layer = draft_layer(ctx.model, spec)
    assert layer is not None
    rows = ctx.plan.attn_dp * ctx.engine.graph_batch(group_tokens(ctx.plan, batch))
    one = layer_time(ctx, layer, tokens=rows, seq=int(context), kv_tokens=batch * context) + head_time(ctx, rows)
    return spec.draft_tokens * one
