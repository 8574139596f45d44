"""Hugging Face ``config.json`` (read from disk, never from a hub) into a ModelSpec."""

from __future__ import annotations

from typing import Any

from meshplan.errors import SpecError
from meshplan.spec.model import ROPE_SCALINGS, ModelSpec, MoESpec, decoder_model
from meshplan.spec.typed import typed

SUPPORTED = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "qwen2_moe", "deepseek_v3", "kimi_k2",
             "gpt2", "gpt_neox")


def _req(cfg: dict, *keys: str, kind: str = "int"):
    """The first of ``keys`` the config gives (not null), checked to be of ``kind`` (``spec.typed.typed``)."""
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return typed(cfg[k], f"config.{k}", kind)
    raise SpecError(f"config.{keys[0]}", None, f"is required for model_type {cfg.get('model_type')!r}")


def _opt(cfg: dict, key: str, default: Any, kind: str, where: str = "config") -> Any:
    """``cfg[key]`` checked to be of ``kind``, or ``default`` where absent or null."""
    return default if cfg.get(key) is None else typed(cfg[key], f"{where}.{key}", kind)


def _rope(cfg: dict) -> dict:
    """RoPE base and scaling (transformers ``modeling_rope_utils``: ``rope_type`` or the older ``type``)."""
    scaling, where = _opt(cfg, "rope_scaling", {}, "table"), "config.rope_scaling"
    kind = scaling.get("rope_type") or scaling.get("type") or "none"
    if kind not in ROPE_SCALINGS:
        raise SpecError("config.rope_scaling.rope_type", kind, f"supported: {', '.join(ROPE_SCALINGS)}")
    out = {"rope_theta": float(_opt(cfg, "rope_theta", 10000.0, "pos"))}
    if kind != "none":
        out |= {"rope_scaling": kind, "rope_scaling_factor": float(_opt(scaling, "factor", 1.0, "pos", where)),
                "rope_mscale": float(_opt(scaling, "mscale", 1.0, "nonneg", where))}
    return out


def _common(cfg: dict) -> dict:
    """Facts every decoder config states the same way: RoPE, norm epsilon, dropout, tied embeddings."""
    return {**_rope(cfg), "norm_eps": float(_opt(cfg, "rms_norm_eps", 1e-5, "pos")),
            "dropout": float(_opt(cfg, "attention_dropout", 0.0, "nonneg")),
            "tied_embeddings": _opt(cfg, "tie_word_embeddings", False, "bool"),
            "max_seq_len": _opt(cfg, "max_position_embeddings", 0, "count")}


def _llama_like(cfg: dict, name: str, family: str) -> ModelSpec:
    hidden = _req(cfg, "hidden_size")
    heads = _req(cfg, "num_attention_heads")
    # Qwen2 (and Qwen2-MoE) biases q/k/v only (HF Qwen2Attention); Qwen3 normalizes q and k per head.
    kw = dict(name=name, family=family, n_layers=_req(cfg, "num_hidden_layers"), hidden=hidden, n_heads=heads,
              n_kv_heads=_opt(cfg, "num_key_value_heads", 0, "count") or heads,
              ffn_hidden=_req(cfg, "intermediate_size"), vocab=_req(cfg, "vocab_size"),
              head_dim=_opt(cfg, "head_dim", 0, "count") or hidden // heads,
              activation="swiglu", norm="rmsnorm", position="rope", qkv_bias=family in ("qwen2", "qwen2_moe"),
              qk_norm=family in ("qwen3", "qwen3_moe"), **_common(cfg))
    return decoder_model(**kw)


def _moe(cfg: dict, name: str, family: str, **extra) -> ModelSpec:
    """Mixtral / Qwen-MoE / DeepSeek: routed experts, optional shared experts and first dense layers."""
    n_exp = _req(cfg, "num_local_experts", "num_experts", "n_routed_experts")
    shared = _opt(cfg, "shared_expert_intermediate_size", 0, "count")
    moe = MoESpec(n_experts=n_exp, top_k=_req(cfg, "num_experts_per_tok"),
                  expert_ffn_hidden=_opt(cfg, "moe_intermediate_size", 0, "count") or _req(cfg, "intermediate_size"),
                  n_shared_experts=_opt(cfg, "n_shared_experts", 0, "count") or (1 if shared else 0),
                  shared_ffn_hidden=shared, **_router(cfg))
    base = _llama_like(cfg, name, family)
    att = base.decoder.attention
    first_dense = _opt(cfg, "first_k_dense_replace", 0, "count")
    extra.setdefault("qkv_bias", att.qkv_bias)
    extra.setdefault("qk_norm", att.qk_norm)
    return decoder_model(name=name, family=family, n_layers=base.n_layers, hidden=base.hidden, n_heads=att.n_heads,
                         n_kv_heads=att.n_kv_heads, head_dim=att.head_dim, ffn_hidden=moe.expert_ffn_hidden,
                         dense_ffn_hidden=_req(cfg, "intermediate_size"), first_dense=first_dense, moe=moe,
                         vocab=base.vocab, **_common(cfg), **extra)


def _router(cfg: dict) -> dict:
    """Router facts: Mixtral/Qwen-MoE ``router_aux_loss_coef``; DeepSeek-V3 ``scoring_func``, ``topk_method``
    ("noaux_tc": expert bias), ``routed_scaling_factor``, ``n_group``/``topk_group``, ``aux_loss_alpha`` with
    ``seq_aux`` (transformers ``DeepseekV3Config``)."""
    aux = "router_aux_loss_coef" if "router_aux_loss_coef" in cfg else "aux_loss_alpha"
    out = {"aux_loss_coeff": float(_opt(cfg, aux, 0.0, "nonneg"))}
    if cfg.get("seq_aux"):
        out["balance_loss"] = "seq_aux_loss"
    if cfg.get("scoring_func") == "sigmoid":
        out["router_score"] = "sigmoid"
    if cfg.get("topk_method") == "noaux_tc":
        # DeepSeek-V3 sec. 4.2: bias update speed 0.001 (the config does not carry it)
        out |= {"router_expert_bias": True, "router_bias_update_rate": 1e-3}
    if _opt(cfg, "n_group", 1, "count") > 1:
        out |= {"router_groups": cfg["n_group"], "router_group_topk": _opt(cfg, "topk_group", 0, "count") or 1}
    out["router_topk_scale"] = float(_opt(cfg, "routed_scaling_factor", 0.0, "nonneg") or 1.0)
    return out


def _deepseek(cfg: dict, name: str) -> ModelSpec:
    # MLA: the non-RoPE query/key part is the head_dim; RoPE and value widths are separate fields.
    # MLA normalizes its compressed latents (HF DeepseekV3Attention q_a_layernorm, kv_a_layernorm); the config's
    # num_nextn_predict_layers multi-token-prediction modules follow the last layer (DeepSeek-V3 sec. 2.2).
    cfg = {**cfg, "head_dim": _req(cfg, "qk_nope_head_dim")}
    model = _moe(cfg, name, "deepseek_v3", attention_kind="mla", q_lora_rank=_opt(cfg, "q_lora_rank", 0, "count"),
                 kv_lora_rank=_req(cfg, "kv_lora_rank"), qk_rope_head_dim=_req(cfg, "qk_rope_head_dim"),
                 v_head_dim=_req(cfg, "v_head_dim"), qk_norm=True)
    mtp = _opt(cfg, "num_nextn_predict_layers", 0, "count")
    return model.with_mtp(mtp) if mtp else model


def _gpt2(cfg: dict, name: str) -> ModelSpec:
    hidden = _req(cfg, "n_embd", "hidden_size")
    return decoder_model(name=name, family="gpt", n_layers=_req(cfg, "n_layer", "num_hidden_layers"), hidden=hidden,
                         n_heads=_req(cfg, "n_head", "num_attention_heads"),
                         n_kv_heads=_req(cfg, "n_head", "num_attention_heads"),
                         ffn_hidden=_opt(cfg, "n_inner", 0, "count") or 4 * hidden, vocab=_req(cfg, "vocab_size"),
                         activation="gelu", norm="layernorm", bias=True, tied_embeddings=True, position="learned",
                         max_seq_len=_opt(cfg, "n_positions", 1024, "count"),
                         norm_eps=float(_opt(cfg, "layer_norm_epsilon", 1e-5, "pos")),
                         dropout=float(_opt(cfg, "resid_pdrop", 0.1, "nonneg")))


def _neox(cfg: dict, name: str) -> ModelSpec:
    heads = _req(cfg, "num_attention_heads")
    return decoder_model(name=name, family="gpt", n_layers=_req(cfg, "num_hidden_layers"),
                         hidden=_req(cfg, "hidden_size"), n_heads=heads, n_kv_heads=heads,
                         ffn_hidden=_req(cfg, "intermediate_size"), vocab=_req(cfg, "vocab_size"), activation="gelu",
                         norm="layernorm", bias=True, tied_embeddings=_opt(cfg, "tie_word_embeddings", False, "bool"),
                         position="rope", max_seq_len=_opt(cfg, "max_position_embeddings", 0, "count"),
                         rope_theta=float(_opt(cfg, "rotary_emb_base", 10000.0, "pos")),
                         norm_eps=float(_opt(cfg, "layer_norm_eps", 1e-5, "pos")),
                         dropout=float(_opt(cfg, "hidden_dropout", 0.0, "nonneg")))


def model_from_hf(cfg: dict, *, name: str = "hf-model") -> ModelSpec:
    """A ModelSpec from a parsed Hugging Face config; unsupported architectures get a clear error."""
    mt = cfg.get("model_type")
    if mt not in SUPPORTED:
        raise SpecError("config.model_type", mt, f"unsupported architecture; supported: {', '.join(SUPPORTED)}")
    if mt in ("llama", "mistral", "qwen2", "qwen3"):
        return _llama_like(cfg, name, mt)
    if mt in ("mixtral", "qwen3_moe", "qwen2_moe"):
        return _moe(cfg, name, mt)
    if mt in ("deepseek_v3", "kimi_k2"):  # Kimi-K2's config names DeepseekV3ForCausalLM as its architecture
        return _deepseek(cfg, name)
    if mt == "gpt2":
        return _gpt2(cfg, name)
    return _neox(cfg, name)
