"""Where a serving replica's bytes live: KV-cache bytes per token (MHA/GQA heads, MLA latents, replicated past
tp = kv heads), the weights of its fullest GPU, the activation peak the engine sizes, and the KV capacity the
engine's own sizing rule leaves; the one home of these quantities for memory, admission and transfer alike."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from meshplan.cost.memory import layer_params
from meshplan.cost.ops import attention_gemms
from meshplan.cost.stage import embedding_params
from meshplan.spec.checks import even_split
from meshplan.spec.cluster import Pool
from meshplan.spec.engine import EngineProfile
from meshplan.spec.hardware import GiB
from meshplan.spec.model import BlockSpec, LayerSpec, ModelSpec
from meshplan.spec.plan import Plan
from meshplan.spec.serving import ServePlan
from meshplan.spec.speculation import draft_layer


def kv_bytes_per_token(layer: LayerSpec, kv_bytes: float) -> float:
    """KV-cache bytes one token of one layer stores, whole (all heads): K and V of every KV head (MHA/GQA,
    2 n_kv d_h b), or MLA's one latent of kv_lora_rank + qk_rope_head_dim (sglang MLATokenToKVPool)."""
    att = layer.attention
    if att is None:
        return 0.0
    if att.kind == "mla":
        return (att.kv_lora_rank + att.qk_rope_head_dim) * kv_bytes
    return 2.0 * att.n_kv_heads * att.head_dim * kv_bytes


def kv_shard(layer: LayerSpec, tp: int) -> int:
    """Ranks one layer's KV is split over: the KV heads over tp, replicated beyond tp = n_kv (each rank keeps at
    least one head); MLA's latent is replicated on every TP rank (``ReplicatedLinear`` kv_a_proj)."""
    att = layer.attention
    if att is None or att.kind == "mla":
        return 1
    return min(tp, att.n_kv_heads)


def stage_blocks(model: ModelSpec, pp: int) -> list[list[BlockSpec]]:
    """The layers of each pipeline stage (even split, remainder to the middle stages)."""
    layers = [b for b, _ in model.layers()]
    out, start = [], 0
    for n in even_split(len(layers), pp):
        out.append(layers[start:start + n])
        start += n
    return out


def kv_bytes_per_token_per_gpu(model: ModelSpec, plan: ServePlan) -> float:
    """KV bytes one token costs the fullest GPU of a replica (its stage's layers, split over tp as far as the
    KV heads allow), with a speculating drafter's own cache: an MTP or EAGLE layer's, or a draft model's."""
    own = max(sum(kv_bytes_per_token(b.layer, plan.kv_bytes) / kv_shard(b.layer, plan.tp) for b in blocks)
              for blocks in stage_blocks(model, plan.pp))
    spec = plan.speculation
    if spec is None or spec.method == "ngram":
        return own
    if spec.draft is not None:
        return own + kv_bytes_per_token_per_gpu(spec.draft, replace(plan, speculation=None))
    layer = draft_layer(model, spec)
    return own + kv_bytes_per_token(layer, plan.kv_bytes) / kv_shard(layer, plan.tp)


@lru_cache(maxsize=256)
def attention_params(layer: LayerSpec) -> float:
    """Parameters of a layer's attention projections (what an attention data-parallel group holds whole)."""
    if layer.attention is None:
        return 0.0
    return sum(g.n * g.k for g in attention_gemms(layer.attention, layer.hidden, 1, 1))


@lru_cache(maxsize=4096)
def weight_bytes_per_gpu(model: ModelSpec, plan: ServePlan) -> float:
    """Weight bytes of the fullest GPU: its stage's layers over tp (experts over ep x expert-tp = tp: whole
    experts over ep, each sliced over the rest of tp, as vLLM FusedMoE and SGLang EP place them), embedding on
    the first stage and the output head on the last (vocab-parallel), those two at ``table_bytes``. Under
    attention data parallelism each group keeps the attention over its tp, and the feed-forward layers (dense
    MLP, shared and routed experts) are spread over all ``tp x attn_dp`` GPUs (SGLang's dense layers run TP over
    the whole group by default, ``moe_dense_tp_size``). Memoised: a pure function of two frozen specs, which the
    search asks of every candidate."""
    probe = Plan(global_batch=1, seq_len=1, tp=plan.tp)
    worst = 0.0
    stages = stage_blocks(model, plan.pp)
    for i, blocks in enumerate(stages):
        table = embedding_params(model, probe, first=i == 0, last=i == len(stages) - 1)
        layers = 0.0
        for b in blocks:
            dense, expert = layer_params(b.layer)
            attn = attention_params(b.layer)
            layers += attn / plan.tp + (dense - attn + expert) / plan.moe_group
        worst = max(worst, layers * plan.weight_bytes + table * table_bytes(plan))
    return worst + draft_weight_bytes(model, plan)


def draft_weight_bytes(model: ModelSpec, plan: ServePlan) -> float:
    """Weight bytes per GPU of a speculating drafter: an MTP or EAGLE layer (its experts, if any, spread as the
    model's), which reuses the model's embedding and output head; or a whole draft model at the same tp."""
    spec = plan.speculation
    if spec is None or spec.method == "ngram":
        return 0.0
    if spec.draft is not None:
        return weight_bytes_per_gpu(spec.draft, replace(plan, speculation=None))
    layer = draft_layer(model, spec)
    dense, expert = layer_params(layer)
    attn = attention_params(layer)
    return (attn / plan.tp + (dense - attn + expert) / plan.moe_group) * plan.weight_bytes


def table_bytes(plan: ServePlan) -> float:
    """Bytes of an embedding or output-head element: 16-bit under fp8 weights, since fp8 recipes quantize only
    the decoder's linear layers (NVIDIA ModelOpt's default config disables the ``*lm_head*`` quantizer and has
    none for embeddings; vLLM's Fp8LinearMethod leaves VocabParallelEmbedding and ParallelLMHead unquantized)."""
    return max(plan.weight_bytes, 2.0)


def activation_element_bytes(plan: ServePlan) -> float:
    """Bytes of one activation element: 16-bit on GPUs (fp8 GEMMs still pass 16-bit activations between
    layers), fp32 when the replica computes in fp32 (a CPU)."""
    return 4.0 if plan.precision == "fp32" else 2.0


def activation_bytes(model: ModelSpec, plan: ServePlan, engine: EngineProfile) -> float:
    """Peak activation memory of the engine's largest step (its profile run of ``activation_tokens``): the
    gated MLP's intermediate and the residual stream in 16 bits, plus fp32 logits of its most sequences
    (vLLM profile_run and sampler dummy run)."""
    layer = model.decoder
    width = (2 if layer.gated else 1) * max(layer.ffn_hidden, layer.moe.expert_ffn_hidden if layer.moe else 0)
    per_token = activation_element_bytes(plan) * (width / plan.tp + 4 * layer.hidden)
    return engine.activation_tokens * per_token + 4.0 * engine.max_num_seqs * model.vocab / plan.tp


def kv_capacity_bytes(model: ModelSpec, pool: Pool, plan: ServePlan, engine: EngineProfile) -> float:
    """KV-cache bytes per GPU the engine allocates, as its own sizing rule computes them (``kv_fraction_of``);
    negative when the weights alone do not fit."""
    hbm = pool.gpu.hbm_bytes
    used = weight_bytes_per_gpu(model, plan) + activation_bytes(model, plan, engine) + engine.runtime_reserve_gib * GiB
    f = engine.kv_memory_fraction
    if engine.kv_fraction_of == "total":  # vLLM: total x util - weights - profile-run peak - non-torch
        return f * hbm - used
    if engine.kv_fraction_of == "free":   # TRT-LLM: fraction of what is free after the engine is loaded
        free = hbm - used
        return f * free if free > 0 else free
    return f * hbm - weight_bytes_per_gpu(model, plan)  # SGLang: weights + KV within fraction x memory
