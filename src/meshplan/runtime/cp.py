"""Context parallelism over the cp axis, on CPU and GPU: ring attention or all-to-all (Ulysses) attention.

PyTorch's ring attention (``_templated_ring_attention`` and its backward, with the zig-zag load balance for causal
masks) is reached through DTensor sharding rules registered only for the CUDA SDPA kernels. This adapter calls the
same ring templates directly from an autograd Function with the kernel of the local device: the CPU flash kernel
``_scaled_dot_product_flash_attention_for_cpu`` (which has no DTensor rule) or the CUDA flash kernel.

All-to-all context parallelism (DeepSpeed-Ulysses, Jacobs et al. 2023) trades the sequence shard for a head shard
before attention (each rank then attends over the whole sequence with heads/cp heads) and back after it; ranks
hold contiguous sequence chunks, so the gathered sequence is in order.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed._functional_collectives import all_to_all_single_autograd
from torch.distributed.tensor.experimental._context_parallel._attention import (
    _templated_ring_attention,
    _templated_ring_attention_backward,
)

aten = torch.ops.aten
_SEQ_DIM = 2
_CUDA_REST = ("cum_seq_q", "cum_seq_k", "max_q", "max_k", "philox_seed", "philox_offset")


class _RingAttention(torch.autograd.Function):
    """Exact causal attention of local queries against every cp rank's keys and values."""

    @staticmethod
    def forward(ctx, q, k, v, group):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        if q.is_cuda:
            out, lse, *rest = _templated_ring_attention(group, _SEQ_DIM, aten._scaled_dot_product_flash_attention,
                                                        q, k, v, is_causal=True, dropout_p=0.0)
            ctx.rest = dict(zip(_CUDA_REST, rest[:len(_CUDA_REST)]))
        else:
            out, lse = _templated_ring_attention(group, _SEQ_DIM, aten._scaled_dot_product_flash_attention_for_cpu,
                                                 q, k, v, is_causal=True, dropout_p=0.0)[:2]
            ctx.rest = {}
        out = out.to(q.dtype)
        ctx.group = group
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        if q.is_cuda:
            op = aten._scaled_dot_product_flash_attention_backward.default
        else:
            op = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
        dq, dk, dv = _templated_ring_attention_backward(
            ctx.group, _SEQ_DIM, op, grad_out=grad_out.contiguous(), grad_out_name="grad_out", query=q, key=k,
            value=v, out=out, logsumexp=lse, is_causal=True, dropout_p=0.0, **ctx.rest)[:3]
        return dq, dk, dv, None


def _pad_values(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Zero-pad value heads to the query width: flash kernels need one head size (MLA's differ), and zero value
    columns leave the other output columns and every gradient unchanged."""
    return F.pad(v, (0, q.shape[-1] - v.shape[-1])) if v.shape[-1] < q.shape[-1] else v


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                   group: dist.ProcessGroup) -> torch.Tensor:
    """Attention core for a cp shard holding zig-zag chunks r and 2*cp-1-r of the sequence ([b, h, s, d])."""
    if not causal:
        raise NotImplementedError("the ring-attention adapter implements causal attention")
    dv = v.shape[-1]
    return _RingAttention.apply(q, k, _pad_values(q, v), group)[..., :dv]


def _seq_to_heads(x: torch.Tensor, cp: int, group: dist.ProcessGroup) -> torch.Tensor:
    """[b, h, s/cp, d] sequence shard -> [b, h/cp, s, d] head shard (rank j's chunk lands at position j)."""
    b, h, s, d = x.shape
    send = x.reshape(b, cp, h // cp, s, d).transpose(0, 1).contiguous()
    got = all_to_all_single_autograd(send, None, None, group)
    return got.reshape(cp, b, h // cp, s, d).permute(1, 2, 0, 3, 4).reshape(b, h // cp, cp * s, d)


def _heads_to_seq(x: torch.Tensor, cp: int, group: dist.ProcessGroup) -> torch.Tensor:
    """Inverse of _seq_to_heads: [b, h/cp, s, d] -> [b, h, s/cp, d]."""
    b, hl, s, d = x.shape
    send = x.reshape(b, hl, cp, s // cp, d).permute(2, 0, 1, 3, 4).contiguous()
    got = all_to_all_single_autograd(send, None, None, group)
    return got.reshape(cp, b, hl, s // cp, d).transpose(0, 1).reshape(b, cp * hl, s // cp, d)


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                      group: dist.ProcessGroup) -> torch.Tensor:
    """Attention core for a cp shard holding contiguous chunk r of the sequence ([b, h, s/cp, d], h divisible by
    cp): all-to-all to a head shard of the whole sequence, local attention, all-to-all back."""
    from meshplan.runtime.models.layers import local_attention

    cp = dist.get_world_size(group)
    q, k, v = (_seq_to_heads(t, cp, group) for t in (q, k, v))
    return _heads_to_seq(local_attention(q, k, v, causal=causal), cp, group)


def cp_core_registry() -> dict:
    """Attention cores by plan.cp_kind."""
    return {"ring": ring_attention, "a2a": ulysses_attention}


def install_context_parallel(module: torch.nn.Module, group: dist.ProcessGroup, *, kind: str = "ring") -> None:
    """Swap every attention core in ``module`` for the ``kind`` context-parallel core over ``group``."""
    from meshplan.runtime.models.layers import Attention
    from meshplan.runtime.models.mla import MLA

    core = cp_core_registry()[kind]
    for m in module.modules():
        if isinstance(m, (Attention, MLA)):
            m.core = partial(core, group=group)
