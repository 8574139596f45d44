"""The model spec: *what* is trained. Dense, GQA, MLA, MoE, and stacks of blocks of different kinds.

A model is a tuple of blocks; each block repeats one layer shape ``n_layers`` times. DeepSeek-V3 is a block of
3 dense layers then a block of 58 MoE layers; a vision-language model is a vision block (fixed tokens per
sample), a projector block (MLP only) and a decoder block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from numbers import Integral, Real

from meshplan.errors import SpecError

ACTIVATIONS = ("gelu", "relu2", "swiglu", "geglu")
GATED = ("swiglu", "geglu")
NORMS = ("layernorm", "rmsnorm")
ATTENTION_KINDS = ("gqa", "mla")
POSITIONS = ("rope", "learned", "alibi", "none")
ROPE_SCALINGS = ("none", "llama3", "yarn")
ROUTER_SCORES = ("softmax", "sigmoid")
BALANCE_LOSSES = ("none", "aux_loss", "seq_aux_loss")


def _positive(field_name: str, value: int, least: int = 1) -> None:
    if not isinstance(value, Integral) or isinstance(value, bool) or value < least:
        raise SpecError(field_name, value, "must be a positive integer" if least else "must be an integer >= 0")


def _finite(field_name: str, value: float, *, positive: bool = False) -> None:
    """A finite real number (and > 0 where ``positive``); NaN, inf and bools are rejected."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or (positive and value <= 0):
        raise SpecError(field_name, value, "must be a finite number" + (" > 0" if positive else ""))


def _flag(field_name: str, value: bool) -> None:
    if not isinstance(value, bool):
        raise SpecError(field_name, value, "must be true or false")


def _member(field_name: str, value: str, options: tuple[str, ...]) -> None:
    if value not in options:
        raise SpecError(field_name, value, f"must be one of {', '.join(options)}")


@dataclass(frozen=True, kw_only=True)
class AttentionSpec:
    """Self-attention of one layer."""

    n_heads: int
    """Query heads."""
    n_kv_heads: int
    """Key/value heads (== n_heads for MHA, 1 for MQA). For MLA, equal to n_heads."""
    head_dim: int
    """Query/key head width (elements); may differ from hidden / n_heads (Qwen3)."""
    kind: str = "gqa"
    """``gqa`` (covers MHA and MQA) or ``mla`` (DeepSeek-V2/V3 multi-head latent attention)."""
    causal: bool = True
    """Causal mask: half the score matrix is computed by flash-attention kernels."""
    q_lora_rank: int = 0
    """MLA: rank of the query down-projection (0 = no query compression)."""
    kv_lora_rank: int = 0
    """MLA: rank of the joint key/value compression."""
    qk_rope_head_dim: int = 0
    """MLA: decoupled RoPE part of each query/key head (head_dim is the non-RoPE part)."""
    v_head_dim: int = 0
    """Value head width; 0 means head_dim."""
    qkv_bias: bool = False
    """The query, key and value projections carry biases while the other linears do not (Qwen2/Qwen2.5: HF
    ``Qwen2Attention`` builds q_proj, k_proj, v_proj with ``bias=True``)."""
    qk_norm: bool = False
    """RMSNorm on queries and keys before the attention core: Qwen3's per-head ``q_norm``/``k_norm`` (HF
    ``Qwen3Attention``); under MLA the norms of the compressed query and key/value latents (HF
    ``DeepseekV3Attention`` ``q_a_layernorm``/``kv_a_layernorm``)."""

    def __post_init__(self) -> None:
        _positive("attention.n_heads", self.n_heads)
        _positive("attention.n_kv_heads", self.n_kv_heads)
        _positive("attention.head_dim", self.head_dim)
        _member("attention.kind", self.kind, ATTENTION_KINDS)
        for f in ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim"):
            _positive(f"attention.{f}", getattr(self, f), 0)
        for f in ("causal", "qkv_bias", "qk_norm"):
            _flag(f"attention.{f}", getattr(self, f))
        if self.n_heads % self.n_kv_heads:
            raise SpecError("attention.n_kv_heads", self.n_kv_heads,
                            f"must divide n_heads={self.n_heads}")
        if self.kind == "mla" and self.kv_lora_rank < 1:
            raise SpecError("attention.kv_lora_rank", self.kv_lora_rank, "MLA needs a positive kv_lora_rank")

    @property
    def v_dim(self) -> int:
        """Value head width (elements)."""
        return self.v_head_dim or self.head_dim

    @property
    def qk_dim(self) -> int:
        """Query/key head width including MLA's RoPE part (elements)."""
        return self.head_dim + self.qk_rope_head_dim


@dataclass(frozen=True, kw_only=True)
class MoESpec:
    """Mixture-of-experts FFN of one layer."""

    n_experts: int
    """Routed experts."""
    top_k: int
    """Experts each token is routed to."""
    expert_ffn_hidden: int
    """FFN width of one expert (gate width for gated activations)."""
    n_shared_experts: int = 0
    """Always-active shared experts (DeepSeek), each of width shared_ffn_hidden."""
    shared_ffn_hidden: int = 0
    """Width of one shared expert; 0 means expert_ffn_hidden."""
    capacity_factor: float = 0.0
    """Token capacity per expert relative to balanced load; 0 means dropless (no padding)."""
    router_score: str = "softmax"
    """Router score function: ``softmax`` (Mixtral, Qwen-MoE) or ``sigmoid`` (DeepSeek-V3 sec. 2.1.2; HF
    ``scoring_func``)."""
    router_expert_bias: bool = False
    """Auxiliary-loss-free balancing: a per-expert bias added to the scores for the top-k choice only
    (DeepSeek-V3 sec. 2.1.2; HF ``topk_method = "noaux_tc"``, ``e_score_correction_bias``)."""
    router_bias_update_rate: float = 0.0
    """Step by which that bias moves per update (DeepSeek-V3 sec. 4.2: gamma = 0.001); 0 without a bias."""
    router_topk_scale: float = 1.0
    """Factor on the routed experts' combined weights (HF DeepSeek-V3 ``routed_scaling_factor``: 2.5)."""
    router_groups: int = 0
    """Expert groups of group-limited routing (HF ``n_group``; DeepSeek-V3: 8); 0 = no grouping."""
    router_group_topk: int = 0
    """Groups one token may route into (HF ``topk_group``; DeepSeek-V3: 4)."""
    balance_loss: str = "aux_loss"
    """Load-balancing loss: ``aux_loss`` (per micro-batch, Switch Transformer eq. 4), ``seq_aux_loss`` (per
    sequence, DeepSeek-V3 eq. 17-20) or ``none``."""
    aux_loss_coeff: float = 0.0
    """Weight of that loss (HF ``router_aux_loss_coef``; DeepSeek-V3 sec. 4.2: alpha = 0.0001)."""

    def __post_init__(self) -> None:
        _positive("moe.n_experts", self.n_experts)
        _positive("moe.top_k", self.top_k)
        _positive("moe.expert_ffn_hidden", self.expert_ffn_hidden)
        if self.top_k > self.n_experts:
            raise SpecError("moe.top_k", self.top_k, f"must be <= n_experts={self.n_experts}")
        for f in ("n_shared_experts", "shared_ffn_hidden", "router_groups", "router_group_topk"):
            _positive(f"moe.{f}", getattr(self, f), 0)
        for f in ("capacity_factor", "router_bias_update_rate", "aux_loss_coeff"):
            _finite(f"moe.{f}", getattr(self, f))
        _finite("moe.router_topk_scale", self.router_topk_scale, positive=True)
        _flag("moe.router_expert_bias", self.router_expert_bias)
        if self.capacity_factor < 0:
            raise SpecError("moe.capacity_factor", self.capacity_factor, "must be >= 0 (0 = dropless)")
        _member("moe.router_score", self.router_score, ROUTER_SCORES)
        _member("moe.balance_loss", self.balance_loss, BALANCE_LOSSES)
        if self.router_groups and (self.n_experts % self.router_groups
                                   or not 0 < self.router_group_topk <= self.router_groups):
            raise SpecError("moe.router_groups", self.router_groups,
                            f"must divide n_experts={self.n_experts} and be >= router_group_topk >= 1")

    @property
    def shared_width(self) -> int:
        """Width of one shared expert (elements)."""
        return self.shared_ffn_hidden or self.expert_ffn_hidden


@dataclass(frozen=True, kw_only=True)
class LayerSpec:
    """One transformer layer (or an MLP-only layer when attention is None, e.g. a projector)."""

    hidden: int
    """Model width d_model (elements)."""
    ffn_hidden: int
    """Dense FFN width; for gated activations the gate/up width. Ignored when moe is set."""
    attention: AttentionSpec | None = None
    """Self-attention, or None for an MLP-only layer."""
    activation: str = "swiglu"
    """``gelu``, ``relu2`` (squared ReLU), ``swiglu`` or ``geglu``."""
    norm: str = "rmsnorm"
    """``layernorm`` or ``rmsnorm``."""
    moe: MoESpec | None = None
    """Mixture of experts replacing the dense FFN, or None."""
    bias: bool = False
    """Linear layers carry biases (GPT-2/3 style)."""
    in_hidden: int = 0
    """Input width when it differs from hidden (a projector from a vision width); 0 means hidden."""
    norm_eps: float = 1e-5
    """Epsilon of the layer's norms (HF ``rms_norm_eps`` / ``layer_norm_epsilon``; Megatron's default 1e-5)."""

    def __post_init__(self) -> None:
        _positive("layer.hidden", self.hidden)
        _positive("layer.ffn_hidden", self.ffn_hidden)
        _member("layer.activation", self.activation, ACTIVATIONS)
        _member("layer.norm", self.norm, NORMS)
        _flag("layer.bias", self.bias)
        _positive("layer.in_hidden", self.in_hidden, 0)
        _finite("layer.norm_eps", self.norm_eps, positive=True)

    @property
    def gated(self) -> bool:
        """The FFN has a gate projection (SwiGLU/GeGLU: three matrices instead of two)."""
        return self.activation in GATED


@dataclass(frozen=True, kw_only=True)
class BlockSpec:
    """A run of identical layers."""

    name: str
    """Role of the block: ``decoder``, ``vision``, ``projector``, ``dense``, ``moe``...; ``mtp`` marks
    multi-token-prediction modules (DeepSeek-V3 sec. 2.2), each of which also runs the output head and loss."""
    n_layers: int
    """Number of layers in the block."""
    layer: LayerSpec
    """The layer repeated n_layers times."""
    tokens: int = 0
    """Fixed tokens per sample (e.g. image patches); 0 means the workload's sequence length."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise SpecError("block.name", self.name, "must be a string")
        _positive(f"block[{self.name}].n_layers", self.n_layers)
        _positive(f"block[{self.name}].tokens", self.tokens, 0)


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A whole model: embeddings, blocks of layers, final norm and output head."""

    name: str
    """Catalog or user name."""
    vocab: int
    """Vocabulary size (padded, as the framework allocates it)."""
    blocks: tuple[BlockSpec, ...]
    """Blocks in execution order; the last one feeds the output head."""
    tied_embeddings: bool = False
    """Input embedding and output head share one matrix."""
    position: str = "rope"
    """Position encoding: ``rope``, ``learned``, ``alibi`` or ``none``."""
    max_seq_len: int = 0
    """Largest sequence length the model supports (0 = unbounded); learned positions need it."""
    family: str = "llama"
    """Family name used by the runtime registry of model builders."""
    rope_theta: float = 10000.0
    """RoPE base (HF ``rope_theta``: Llama 3 500000, Mixtral and Qwen2.5 1e6, DeepSeek-V3 10000)."""
    rope_scaling: str = "none"
    """RoPE frequency scaling: ``none``; ``llama3`` (Llama 3.1/3.2, HF ``rope_type = "llama3"``: low/high
    frequency factors 1 and 4 over 8192 original positions); ``yarn`` (DeepSeek-V2/V3: YaRN over 4096 original
    positions, beta_fast 32, beta_slow 1)."""
    rope_scaling_factor: float = 1.0
    """Factor of ``rope_scaling`` (Llama 3.1: 8, Llama 3.2: 32, DeepSeek-V3: 40)."""
    rope_mscale: float = 1.0
    """YaRN attention-scale coefficient, HF ``rope_scaling.mscale`` = ``mscale_all_dim`` (DeepSeek-V3: 1.0)."""
    dropout: float = 0.0
    """Training dropout on attention probabilities and residual branches (HF ``attention_dropout``; 0 for
    Llama, Mixtral, Qwen and DeepSeek)."""

    def __post_init__(self) -> None:
        for f in ("name", "family"):
            if not isinstance(getattr(self, f), str):
                raise SpecError(f"model.{f}", getattr(self, f), "must be a string")
        _positive("model.vocab", self.vocab)
        _positive("model.max_seq_len", self.max_seq_len, 0)
        _flag("model.tied_embeddings", self.tied_embeddings)
        _member("model.position", self.position, POSITIONS)
        _member("model.rope_scaling", self.rope_scaling, ROPE_SCALINGS)
        for f in ("rope_theta", "rope_scaling_factor"):
            _finite(f"model.{f}", getattr(self, f), positive=True)
        _finite("model.rope_mscale", self.rope_mscale)
        _finite("model.dropout", self.dropout)
        if not 0 <= self.dropout < 1:
            raise SpecError("model.dropout", self.dropout, "must be in [0, 1)")
        if not self.blocks:
            raise SpecError("model.blocks", self.blocks, "a model needs at least one block")

    @property
    def n_layers(self) -> int:
        """All layers of all blocks."""
        return sum(b.n_layers for b in self.blocks)

    @property
    def hidden(self) -> int:
        """Width of the last block (the one the output head reads)."""
        return self.blocks[-1].layer.hidden

    @property
    def decoder(self) -> LayerSpec:
        """The last block's layer (the language model's layer in a multimodal stack)."""
        return self.blocks[-1].layer

    def layers(self) -> tuple[tuple[BlockSpec, int], ...]:
        """Every layer in order as (block, index within the block)."""
        return tuple((b, i) for b in self.blocks for i in range(b.n_layers))

    @property
    def is_moe(self) -> bool:
        """Any block uses experts."""
        return any(b.layer.moe is not None for b in self.blocks)

    def with_mtp(self, depth: int) -> "ModelSpec":
        """The model plus ``depth`` multi-token-prediction modules (DeepSeek-V3 sec. 2.2): each is one more
        layer of the last block whose input projection maps [norm(embedding); norm(hidden)] (2h) to h."""
        last = self.blocks[-1]
        layer = replace(last.layer, in_hidden=2 * last.layer.hidden)
        return replace(self, blocks=self.blocks + (BlockSpec(name="mtp", n_layers=depth, layer=layer),))


def decoder_model(*, name: str, n_layers: int, hidden: int, n_heads: int, n_kv_heads: int, ffn_hidden: int,
                  vocab: int, **kw) -> ModelSpec:
    """Convenience builder for a single-block decoder (keyword options: head_dim, activation, norm, norm_eps,
    bias, qkv_bias, qk_norm, moe, first_dense, dense_ffn_hidden, attention_kind, mla ranks, and ModelSpec's
    own fields)."""
    _positive("model.n_layers", n_layers)
    _positive("model.hidden", hidden)
    _positive("attention.n_heads", n_heads)
    head_dim = kw.pop("head_dim", 0) or hidden // n_heads  # as transformers' Llama does (a file must divide)
    att = AttentionSpec(n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim,
                        kind=kw.pop("attention_kind", "gqa"), q_lora_rank=kw.pop("q_lora_rank", 0),
                        kv_lora_rank=kw.pop("kv_lora_rank", 0), qk_rope_head_dim=kw.pop("qk_rope_head_dim", 0),
                        v_head_dim=kw.pop("v_head_dim", 0), qkv_bias=kw.pop("qkv_bias", False),
                        qk_norm=kw.pop("qk_norm", False))
    layer_kw = {k: kw.pop(k) for k in ("activation", "norm", "norm_eps", "bias") if k in kw}
    moe: MoESpec | None = kw.pop("moe", None)
    first_dense = kw.pop("first_dense", 0)
    _positive("model.first_dense", first_dense, 0)
    if moe is not None and first_dense >= n_layers:
        raise SpecError("model.first_dense", first_dense, f"must be fewer than the n_layers = {n_layers}")
    dense_ffn = kw.pop("dense_ffn_hidden", 0) or ffn_hidden
    blocks = []
    if moe is not None and first_dense:
        blocks.append(BlockSpec(name="dense", n_layers=first_dense,
                                layer=LayerSpec(hidden=hidden, ffn_hidden=dense_ffn, attention=att, **layer_kw)))
    rest = n_layers - (first_dense if moe is not None else 0)
    blocks.append(BlockSpec(name="moe" if moe is not None else "decoder", n_layers=rest,
                            layer=LayerSpec(hidden=hidden, ffn_hidden=ffn_hidden, attention=att, moe=moe,
                                            **layer_kw)))
    return ModelSpec(name=name, vocab=vocab, blocks=tuple(blocks), **kw)
