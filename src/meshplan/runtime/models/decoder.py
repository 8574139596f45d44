"""meshplan's reference decoder, built from a ModelSpec: dense GQA/SwiGLU (Llama), GPT-2 style, MLA and MoE.

A ``Decoder`` may hold only a slice of the layers (a pipeline stage); layers live in a ModuleDict keyed by their
global index, so parameter names (``layers.7.attention.wq.weight``) are the same under every layout and a
checkpoint written under one plan loads under another. Weights are initialized per parameter from a generator
seeded by (seed, name): every layout starts from bit-identical weights without ever building the full model.
"""

from __future__ import annotations

import zlib

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate
from torch.utils.checkpoint import checkpoint

from meshplan.errors import SpecError
from meshplan.runtime.models.layers import MLP, Attention, make_norm
from meshplan.runtime.models.mla import MLA
from meshplan.runtime.models.moe import MoE
from meshplan.spec.model import LayerSpec, ModelSpec


class Block(nn.Module):
    """Pre-norm transformer layer: ``h + attn(norm(h))`` then ``h + ffn(norm(h))``."""

    def __init__(self, *, layer: LayerSpec, rope: bool):
        super().__init__()
        self.attention_norm = make_norm(layer)
        kind = MLA if layer.attention.kind == "mla" else Attention
        self.attention = kind(hidden=layer.hidden, att=layer.attention, bias=layer.bias, rope=rope)
        self.ffn_norm = make_norm(layer)
        if layer.moe is not None:
            self.moe = MoE(layer=layer)
        else:
            self.feed_forward = MLP(hidden=layer.hidden, ffn=layer.ffn_hidden, activation=layer.activation,
                                    bias=layer.bias)

        self.recompute = "none"
        """``none``, ``full`` (recompute the whole layer in backward) or ``selective`` (attention core only)."""

    def _forward(self, h: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = h + self.attention(self.attention_norm(h), positions)
        ffn = self.moe if hasattr(self, "moe") else self.feed_forward
        return h + ffn(self.ffn_norm(h))

    def forward(self, h: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self.recompute == "full" and torch.is_grad_enabled():
            return checkpoint(self._forward, h, positions, use_reentrant=False)
        return self._forward(h, positions)


def check_supported(model: ModelSpec) -> None:
    """Raise SpecError when the reference decoder cannot build this model."""
    for b in model.blocks:
        att = b.layer.attention
        if att is None:
            raise SpecError(f"block[{b.name}]", "mlp-only", "the reference decoder needs attention in every layer")
        if att.kind == "mla" and att.qk_rope_head_dim % 2:
            raise SpecError(f"block[{b.name}].attention.qk_rope_head_dim", att.qk_rope_head_dim,
                            "MLA's rotary part needs an even width")
        if b.tokens or (b.layer.in_hidden and b.layer.in_hidden != b.layer.hidden) or b.layer.hidden != model.hidden:
            raise SpecError(f"block[{b.name}]", b.name, "the reference decoder needs one hidden width and text tokens")
    if model.position == "alibi":
        raise SpecError("model.position", "alibi", "the reference decoder supports rope, learned and none")


class Decoder(nn.Module):
    """Embeddings, a contiguous or arbitrary subset of layers, final norm and output head.

    Args:
        spec: the model.
        layer_ids: global indices of the layers this module holds (all of them for the whole model).
        first: holds the token (and learned position) embeddings.
        last: holds the final norm and the output head.
        max_seq_len: positions to allocate for learned position embeddings.
    """

    def __init__(self, *, spec: ModelSpec, layer_ids: tuple[int, ...], first: bool, last: bool, max_seq_len: int):
        super().__init__()
        check_supported(spec)
        layers = spec.layers()
        self.tied = spec.tied_embeddings
        self.tok_embeddings = nn.Embedding(spec.vocab, spec.hidden) if first or (last and self.tied) else None
        learned = spec.position == "learned"
        self.pos_embeddings = nn.Embedding(spec.max_seq_len or max_seq_len, spec.hidden) if first and learned else None
        self.layers = nn.ModuleDict({str(i): Block(layer=layers[i][0].layer, rope=spec.position == "rope")
                                     for i in layer_ids})
        self.norm = make_norm(spec.decoder) if last else None
        self.output = None
        if last and not self.tied:
            self.output = nn.Linear(spec.hidden, spec.vocab, bias=False)
        self.first, self.last = first, last
        self.positions: torch.Tensor | None = None
        """Token positions this rank holds when not passed to forward (set by context parallelism)."""
        self.vocab_parallel = False
        """Return the logits as a DTensor sharded by vocabulary over tp (loss parallel; set by tensor parallelism)."""

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Token ids [batch, seq] (first stage) or hidden states [batch, seq, hidden] -> hidden or logits."""
        if positions is None:
            positions = self.positions if self.positions is not None else torch.arange(x.shape[1], device=x.device)
        h = x
        if self.first:
            h = self.tok_embeddings(x)
            if self.pos_embeddings is not None:
                h = h + self.pos_embeddings(positions)[None]
        for layer in self.layers.values():
            h = layer(h, positions)
        if not self.last:
            return h
        h = self.norm(h)
        if self.output is not None:
            return self.output(h)
        return tied_logits(h, self.tok_embeddings.weight, vocab_parallel=self.vocab_parallel)


def tied_logits(h: torch.Tensor, weight: torch.Tensor, *, vocab_parallel: bool = False) -> torch.Tensor:
    """Output head on the tied embedding. Under tensor parallelism the embedding is split by vocabulary rows
    (a DTensor), so each tp rank computes its vocabulary slice of the logits from the gathered sequence
    (Megatron's parallel LM head on the shared word embedding); the slices stay sharded (a DTensor) when
    ``vocab_parallel``, else they are gathered."""
    if not isinstance(weight, DTensor):
        return h @ weight.t()
    if not isinstance(h, DTensor):
        h = DTensor.from_local(h, weight.device_mesh, [Replicate()], run_check=False)
    logits = h.redistribute(placements=[Replicate()]) @ weight.t()
    if vocab_parallel:
        return logits
    return logits.redistribute(placements=[Replicate()]).to_local()


def _param_seed(seed: int, name: str) -> int:
    return zlib.crc32(f"{seed}:{name}".encode())


def init_weights(module: nn.Module, *, seed: int, n_layers: int) -> None:
    """Initialize every parameter from its own seeded generator (GPT-2 scheme: N(0, 0.02), residual outputs
    scaled by 1/sqrt(2 n_layers), norms one, biases zero), identical for any subset of layers."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "bias":
                p.zero_()
            elif "norm" in name:
                p.fill_(1.0)
            else:
                std = 0.02
                if name.endswith(("wo.weight", "w2.weight", "moe.w2")):
                    std = 0.02 / (2 * n_layers) ** 0.5
                g = torch.Generator().manual_seed(_param_seed(seed, name))
                p.copy_(torch.randn(p.shape, generator=g) * std)


def build_decoder(spec: ModelSpec, *, layer_ids: tuple[int, ...] | None = None, first: bool = True,
                  last: bool = True, seed: int = 0, max_seq_len: int = 2048) -> Decoder:
    """A seeded Decoder holding ``layer_ids`` (default: every layer), on the CPU, in fp32."""
    ids = tuple(range(spec.n_layers)) if layer_ids is None else layer_ids
    model = Decoder(spec=spec, layer_ids=ids, first=first, last=last, max_seq_len=max_seq_len)
    init_weights(model, seed=seed, n_layers=spec.n_layers)
    return model
