"""The model-defining ``pretrain_gpt.py`` arguments: shapes, norms, biases, RoPE, dropout, vocabulary, MLA, MoE
router and multi-token prediction, from the ModelSpec's fields.

Each flag is a Megatron-LM option (``megatron/training/arguments.py`` at core_v0.16.1, where the transformer
options are generated from megatron-core's ``TransformerConfig`` fields; the same names exist at 000c4ac2). Where a
Megatron default differs from the model, the flag is always written: the defaults are GPT-2's (dropout 0.1, RoPE
base 10000, vocabulary padded to 128 * tp).
"""

from __future__ import annotations

from meshplan.cost.stage import mtp_depth
from meshplan.export.layout import decoder_layers, dense_ffn, model_notes, moe_first_dense
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import Plan

Args = list[tuple[str, object]]
"""(flag, value) pairs; value None means a bare switch."""

_NORMS = {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}
_POSITIONS = {"rope": "rope", "learned": "learned_absolute", "none": "none"}


def _number(x: float) -> int | float:
    """An integral float as an int (``--rotary-base`` is ``type=int`` in arguments.py), else the float."""
    return int(x) if float(x).is_integer() else x


def shape_args(model: ModelSpec, plan: Plan) -> tuple[Args, list[str]]:
    """Sizes, norm, activation, biases, dropout, embeddings and vocabulary."""
    dec, att = model.decoder, model.decoder.attention
    notes: list[str] = []
    args: Args = [("--num-layers", decoder_layers(model)), ("--hidden-size", dec.hidden),
                  ("--ffn-hidden-size", dense_ffn(model)), ("--num-attention-heads", att.n_heads)]
    if att.kind == "gqa" and att.head_dim * att.n_heads != dec.hidden:
        args.append(("--kv-channels", att.head_dim))
    if att.kind == "gqa" and att.n_kv_heads < att.n_heads:
        args += [("--group-query-attention", None), ("--num-query-groups", att.n_kv_heads)]
    args += [("--seq-length", plan.seq_len), ("--max-position-embeddings", max(plan.seq_len, model.max_seq_len))]
    args += [("--normalization", _NORMS[dec.norm]), ("--norm-epsilon", dec.norm_eps)]
    if dec.activation == "swiglu":
        args.append(("--swiglu", None))
    elif dec.activation == "relu2":
        args.append(("--squared-relu", None))
    elif dec.activation == "geglu":
        notes.append("GeGLU: pretrain_gpt.py has no flag for gelu with a gated linear unit (--quick-geglu is a "
                     "different function); exported as --swiglu, which has the same shapes and FLOPs")
        args.append(("--swiglu", None))
    if not dec.bias:
        args.append(("--disable-bias-linear", None))
        if att.qkv_bias:
            args.append(("--add-qkv-bias", None))  # TransformerConfig.add_qkv_bias: biases on linear_qkv only
    if att.qk_norm:
        args.append(("--qk-layernorm", None))  # MLA: the q and kv latent norms (MLASelfAttention q/kv_layernorm)
    # Megatron's defaults are 0.1 (arguments.py --attention-dropout/--hidden-dropout)
    args += [("--attention-dropout", model.dropout), ("--hidden-dropout", model.dropout)]
    if not model.tied_embeddings:
        args.append(("--untie-embeddings-and-output-weights", None))
    vocab, vocab_notes = vocab_args(model, plan)
    return args + vocab, notes + vocab_notes + model_notes(model)


def vocab_args(model: ModelSpec, plan: Plan) -> tuple[Args, list[str]]:
    """``--make-vocab-size-divisible-by vocab / tp``: the tokenizer's vocabulary is padded up to a multiple of that
    times tp (megatron/training/tokenizer/tokenizer.py _vocab_size_with_padding), so every tokenizer of at most
    ``vocab`` tokens gives exactly the model's ``vocab`` rows, as its checkpoint has them."""
    args: Args = [("--vocab-size", model.vocab)]
    if model.vocab % plan.tp:
        return args, [f"vocab={model.vocab} is not a multiple of tp={plan.tp}: Megatron pads the embedding to "
                      f"{-(-model.vocab // plan.tp) * plan.tp} rows"]
    return args + [("--make-vocab-size-divisible-by", model.vocab // plan.tp)], []


def rope_args(model: ModelSpec) -> tuple[Args, list[str]]:
    """Position encoding, RoPE base and scaling (arguments.py's --rotary-base defaults to 10000 whatever the
    checkpoint or tokenizer says)."""
    notes: list[str] = []
    if model.position not in _POSITIONS:
        notes.append(f"position encoding '{model.position}': Megatron-LM has no such option; exported as rope")
    args: Args = [("--position-embedding-type", _POSITIONS.get(model.position, "rope"))]
    if model.position not in ("rope", "alibi"):
        return args, notes
    if not float(model.rope_theta).is_integer():
        notes.append(f"rope_theta={model.rope_theta}: --rotary-base is an integer; exported rounded")
    args.append(("--rotary-base", int(round(model.rope_theta))))
    mla = model.decoder.attention.kind == "mla"
    if mla:
        # MLATransformerConfig.rope_type defaults to yarn, arguments.py's --rotary-scaling-factor to 1.0 and
        # --mscale-all-dim to 0.0, so all three are written
        args.append(("--rope-type", "yarn" if model.rope_scaling == "yarn" else "rope"))
    if model.rope_scaling == "llama3":
        # megatron/core/models/common/embeddings/rotary_pos_embedding.py _apply_scaling: low/high frequency
        # factors 1 and 4 over 8192 original positions, as Llama 3.1 defines them
        args += [("--use-rope-scaling", None), ("--rope-scaling-factor", _number(model.rope_scaling_factor))]
    elif model.rope_scaling == "yarn" and mla:
        args += [("--rotary-scaling-factor", _number(model.rope_scaling_factor)), ("--mscale", model.rope_mscale),
                 ("--mscale-all-dim", model.rope_mscale)]
    elif model.rope_scaling == "yarn":
        notes.append("YaRN RoPE scaling outside MLA: pretrain_gpt.py's YaRN options apply to MLA only; exported "
                     "without scaling")
    return args, notes


def mla_args(model: ModelSpec) -> Args:
    """Multi-latent attention ranks and head widths."""
    att = model.decoder.attention
    if att.kind != "mla":
        return []
    args: Args = [("--multi-latent-attention", None)]
    if att.q_lora_rank:
        args.append(("--q-lora-rank", att.q_lora_rank))
    return args + [("--kv-lora-rank", att.kv_lora_rank), ("--qk-head-dim", att.head_dim),
                   ("--qk-pos-emb-head-dim", att.qk_rope_head_dim), ("--v-head-dim", att.v_dim)]


def moe_args(model: ModelSpec, plan: Plan) -> Args:
    """Experts, shared experts, dense-first layers, capacity and the router."""
    moe = model.decoder.moe
    if moe is None:
        return []
    args: Args = [("--num-experts", moe.n_experts), ("--moe-router-topk", moe.top_k),
                  ("--moe-ffn-hidden-size", moe.expert_ffn_hidden), ("--moe-grouped-gemm", None)]
    if moe.n_shared_experts:
        args.append(("--moe-shared-expert-intermediate-size", moe.n_shared_experts * moe.shared_width))
    dense = moe_first_dense(model)
    if dense > 0:
        args.append(("--moe-layer-freq", f"([0]*{dense}+[1]*{decoder_layers(model) - dense})"))
    if moe.capacity_factor:
        args.append(("--moe-expert-capacity-factor", moe.capacity_factor))
    if plan.ep > 1:
        args.append(("--moe-token-dispatcher-type", "alltoall"))
    return args + router_args(model)


def router_args(model: ModelSpec) -> Args:
    """Score function, expert bias, top-k scale, group-limited routing and the balance loss, with the names of
    megatron-core's TransformerConfig.moe_router_* fields (Megatron-Bridge v0.2.1 DeepSeekV3ModelProvider sets
    the same for DeepSeek-V3)."""
    moe = model.decoder.moe
    args: Args = [("--moe-router-score-function", moe.router_score)]
    if moe.router_expert_bias:
        args += [("--moe-router-enable-expert-bias", None),
                 ("--moe-router-bias-update-rate", moe.router_bias_update_rate)]
    if moe.router_topk_scale != 1.0:
        args.append(("--moe-router-topk-scaling-factor", moe.router_topk_scale))
    if moe.router_groups:
        args += [("--moe-router-num-groups", moe.router_groups), ("--moe-router-group-topk", moe.router_group_topk)]
    return args + [("--moe-router-load-balancing-type", moe.balance_loss),
                   ("--moe-aux-loss-coeff", moe.aux_loss_coeff)]


def mtp_args(model: ModelSpec) -> Args:
    """Multi-token-prediction modules (megatron-core TransformerConfig.mtp_num_layers; its loss weight keeps the
    default 0.1, DeepSeek-V3 sec. 4.2's value after the first 10T tokens)."""
    depth = mtp_depth(model)
    return [("--mtp-num-layers", depth)] if depth else []


def model_args(model: ModelSpec, plan: Plan) -> tuple[Args, list[str]]:
    """Every model-defining argument and what it approximates."""
    shape, n1 = shape_args(model, plan)
    rope, n2 = rope_args(model)
    return shape + rope + mla_args(model) + moe_args(model, plan) + mtp_args(model), n1 + n2
