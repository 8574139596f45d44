"""Multi-head latent attention (MLA, DeepSeek-V2 2024 section 2.1; DeepSeek-V3 2024).

Keys and values are rebuilt per head from one shared low-rank latent ``c_kv = kv_norm(wkv_a x)``; each query/key
head has a non-RoPE part (``head_dim``) and a decoupled RoPE part (``qk_rope_head_dim``) whose key half is one
vector shared by all heads. Queries are optionally compressed the same way (``q_lora_rank``). Parameter names
follow DeepSeek's reference code (``wq`` or ``wq_a``/``q_norm``/``wq_b``, ``wkv_a``, ``kv_norm``, ``wkv_b``,
``wo``). YaRN's softmax rescaling is left out: the scale is 1/sqrt(head_dim + qk_rope_head_dim).

Under tensor parallelism the head projections ``wq``/``wq_b``, ``wkv_b`` (columns) and ``wo`` (rows) are sharded;
the down-projections and their norms are replicated, and the shared RoPE key goes through ``tp_copy`` so its
gradient sums every rank's heads.
"""

from __future__ import annotations

import torch
from torch import nn

from meshplan.runtime.models.layers import attend, local_attention, rotary, tp_copy
from meshplan.spec.model import AttentionSpec


class MLA(nn.Module):
    """Multi-head latent self-attention; head counts are read from the projection widths (tp shards work)."""

    def __init__(self, *, hidden: int, att: AttentionSpec, bias: bool, rope: bool):
        super().__init__()
        self.nope, self.rope_dim, self.v_dim = att.head_dim, att.qk_rope_head_dim, att.v_dim
        self.kv_rank = att.kv_lora_rank
        self.causal, self.rope = att.causal, rope
        qk = att.n_heads * att.qk_dim
        if att.q_lora_rank:
            self.wq_a = nn.Linear(hidden, att.q_lora_rank, bias=bias)
            self.q_norm = nn.RMSNorm(att.q_lora_rank, eps=1e-5)
            self.wq_b = nn.Linear(att.q_lora_rank, qk, bias=bias)
        else:
            self.wq = nn.Linear(hidden, qk, bias=bias)
        self.wkv_a = nn.Linear(hidden, att.kv_lora_rank + att.qk_rope_head_dim, bias=bias)
        self.kv_norm = nn.RMSNorm(att.kv_lora_rank, eps=1e-5)
        self.wkv_b = nn.Linear(att.kv_lora_rank, att.n_heads * (att.head_dim + att.v_dim), bias=bias)
        self.wo = nn.Linear(att.n_heads * att.v_dim, hidden, bias=bias)
        self.core = local_attention
        self.recompute_core = False
        """Selective recomputation of the attention core."""
        self.tp_mesh = None
        """The tensor-parallel mesh when heads are sharded (set by tensor parallelism), else None."""

    def _queries(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "wq"):
            return self.wq(x)
        return self.wq_b(self.q_norm(self.wq_a(x)))

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q_nope, q_pe = self._queries(x).view(b, s, -1, self.nope + self.rope_dim).split(
            [self.nope, self.rope_dim], dim=-1)
        latent, k_pe = self.wkv_a(x).split([self.kv_rank, self.rope_dim], dim=-1)
        kv = self.wkv_b(self.kv_norm(latent)).view(b, s, -1, self.nope + self.v_dim)
        k_nope, v = kv.split([self.nope, self.v_dim], dim=-1)
        k_pe = tp_copy(k_pe, self.tp_mesh).unsqueeze(2)
        if self.rope and self.rope_dim:
            q_pe, k_pe = rotary(q_pe, positions), rotary(k_pe, positions)
        q = torch.cat([q_nope, q_pe], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(-1, -1, k_nope.shape[2], -1)], dim=-1)
        return self.wo(attend(self, q, k, v))
