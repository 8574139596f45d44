"""Context parallelism: ring attention over the cp axis, on CPU and GPU.

PyTorch's ring attention (``_templated_ring_attention`` and its backward, with the zig-zag load balance for causal
masks) is reached through DTensor sharding rules registered only for the CUDA SDPA kernels. This adapter calls the
same ring templates directly from an autograd Function with the kernel of the local device: the CPU flash kernel
``_scaled_dot_product_flash_attention_for_cpu`` (which has no DTensor rule) or the CUDA flash kernel.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist
from torch.distributed.tensor.experimental._context_parallel._attention import (
    _templated_ring_attention, _templated_ring_attention_backward)

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


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
                   group: dist.ProcessGroup) -> torch.Tensor:
    """Attention core for a cp shard holding zig-zag chunks r and 2*cp-1-r of the sequence ([b, h, s, d])."""
    if not causal:
        raise NotImplementedError("the ring-attention adapter implements causal attention")
    return _RingAttention.apply(q, k, v, group)


def install_ring_attention(module: torch.nn.Module, group: dist.ProcessGroup) -> None:
    """Swap every Attention core in ``module`` for ring attention over ``group``."""
    from meshplan.runtime.models.layers import Attention

    for m in module.modules():
        if isinstance(m, Attention):
            m.core = partial(ring_attention, group=group)
