"""Building blocks of the reference decoder: norms, rotary positions, attention and the dense MLP.

Readable nanoGPT-style modules. Every linear layer is an ``nn.Linear`` with a stable name (``wq``, ``wo``,
``w1``...) so tensor parallelism can address it by name and checkpoints keep the same keys under any layout.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Partial, Replicate
from torch.utils.checkpoint import checkpoint

from meshplan.spec.model import AttentionSpec, LayerSpec


def make_norm(layer: LayerSpec) -> nn.Module:
    """RMSNorm or LayerNorm over the hidden width (eps 1e-5)."""
    if layer.norm == "rmsnorm":
        return nn.RMSNorm(layer.hidden, eps=1e-5)
    return nn.LayerNorm(layer.hidden, eps=1e-5, bias=layer.bias)


def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Apply rotary position embedding (RoPE, Su et al. 2021) to ``x`` [batch, seq, heads, dim].

    Args:
        x: queries or keys, last dim even.
        positions: absolute token positions [seq] (int), so a context-parallel shard rotates by its true
            positions; or [batch, seq] when each sequence is at its own position (batched decoding).
        theta: RoPE base.
    """
    dim = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim))
    angles = positions.to(torch.float32)[..., None] * inv  # [seq, dim/2], or [batch, seq, dim/2] when decoding
    if angles.dim() == 2:
        angles = angles[None]
    cos, sin = angles.cos()[:, :, None, :], angles.sin()[:, :, None, :]
    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return out.to(x.dtype)


def local_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool) -> torch.Tensor:
    """Scaled dot-product attention on [batch, heads, seq, dim] tensors (the default attention core)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def tp_copy(x: torch.Tensor, mesh) -> torch.Tensor:
    """Identity in forward, sum over the tensor-parallel ``mesh`` in backward (Megatron's copy to the tensor-parallel
    region): for a replicated activation that each tp rank consumes only in part (its heads), so its gradient is
    a partial sum. Identity when mesh is None."""
    if mesh is None:
        return x
    return DTensor.from_local(x, mesh, [Replicate()], run_check=False).to_local(grad_placements=[Partial()])


def attend(module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Run ``module.core`` on [batch, seq, heads, dim] q, k, v (checkpointed under selective recompute); returns
    [batch, seq, heads * v_dim]."""
    b, s = q.shape[:2]
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if module.recompute_core and torch.is_grad_enabled():
        out = checkpoint(module.core, q, k, v, causal=module.causal, use_reentrant=False)
    else:
        out = module.core(q, k, v, causal=module.causal)
    return out.transpose(1, 2).reshape(b, s, -1)


class Attention(nn.Module):
    """Grouped-query self-attention (covers MHA and MQA). Head counts are read from the projection widths, so
    the same code runs on a tensor-parallel shard holding n_heads / tp heads.

    When tp exceeds the kv heads, tensor parallelism leaves ``wk``/``wv`` whole on every tp rank and sets
    ``kv_index`` (the kv head of each local query head) and ``tp_mesh``: each rank then picks the kv heads its
    query heads read, which is Megatron's kv-head replication.
    """

    def __init__(self, *, hidden: int, att: AttentionSpec, bias: bool, rope: bool):
        super().__init__()
        self.head_dim = att.head_dim
        self.group = att.n_heads // att.n_kv_heads
        self.causal = att.causal
        self.rope = rope
        self.wq = nn.Linear(hidden, att.n_heads * att.head_dim, bias=bias)
        self.wk = nn.Linear(hidden, att.n_kv_heads * att.head_dim, bias=bias)
        self.wv = nn.Linear(hidden, att.n_kv_heads * att.head_dim, bias=bias)
        self.wo = nn.Linear(att.n_heads * att.head_dim, hidden, bias=bias)
        # The attention core is swappable: context parallelism installs a ring-attention core here.
        self.core = local_attention
        self.recompute_core = False
        """Selective recomputation: keep no attention-core activations, recompute them in backward."""
        self.kv_index: torch.Tensor | None = None
        """With replicated kv heads: the kv head each local query head reads."""
        self.tp_mesh = None
        """With replicated kv heads: the tp mesh their gradients are summed over."""

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        if self.rope:
            q, k = rotary(q, positions), rotary(k, positions)
        if self.kv_index is not None:
            k, v = tp_copy(k, self.tp_mesh)[:, :, self.kv_index], tp_copy(v, self.tp_mesh)[:, :, self.kv_index]
        elif self.group > 1:
            k = k.repeat_interleave(self.group, dim=2)
            v = v.repeat_interleave(self.group, dim=2)
        return self.wo(attend(self, q, k, v))


def activate(kind: str, x: torch.Tensor) -> torch.Tensor:
    """The non-gated part of an activation: SiLU for SwiGLU, GELU for GELU/GeGLU, squared ReLU for relu2."""
    if kind == "swiglu":
        return F.silu(x)
    if kind == "relu2":
        return F.relu(x).square()
    return F.gelu(x)


class MLP(nn.Module):
    """Dense feed-forward: ``w2(act(w1 x) * w3 x)`` when gated, else ``w2(act(w1 x))``."""

    def __init__(self, *, hidden: int, ffn: int, activation: str, bias: bool):
        super().__init__()
        self.activation = activation
        self.w1 = nn.Linear(hidden, ffn, bias=bias)
        self.w2 = nn.Linear(ffn, hidden, bias=bias)
        self.w3 = nn.Linear(hidden, ffn, bias=bias) if activation in ("swiglu", "geglu") else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = activate(self.activation, self.w1(x))
        if self.w3 is not None:
            h = h * self.w3(x)
        return self.w2(h)
