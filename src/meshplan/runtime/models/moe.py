"""Mixture-of-experts FFN: top-k router, dropless grouped experts, optional expert-parallel all-to-all dispatch.

Expert weights are stacked 3-D parameters ``w1/w3 [experts, hidden, ffn]`` and ``w2 [experts, ffn, hidden]``.
Under expert parallelism a rank holds ``n_experts / ep`` consecutive experts; tokens travel to their experts'
ranks with an autograd-aware all-to-all (GShard, Lepikhin et al. 2020) and come back the same way. Under expert
tensor parallelism (etp) each rank also holds only a 1/etp slice of every local expert's FFN width, so its output
is a partial sum over the etp group (Megatron's expert tensor parallelism).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from meshplan.runtime.models.layers import MLP, activate
from meshplan.spec.model import LayerSpec


@dataclass(frozen=True, kw_only=True)
class ExpertGroup:
    """Where this rank's experts sit in an expert-parallel group."""

    group: dist.ProcessGroup
    """The ep process group (size ep)."""
    size: int
    """Expert-parallel degree."""
    rank: int
    """This rank's index inside the ep group."""


class MoE(nn.Module):
    """Routed experts plus optional always-on shared experts."""

    def __init__(self, *, layer: LayerSpec):
        super().__init__()
        moe = layer.moe
        self.top_k = moe.top_k
        self.n_experts = moe.n_experts
        self.activation = layer.activation
        self.gated = layer.gated
        h, f, e = layer.hidden, moe.expert_ffn_hidden, moe.n_experts
        self.router = nn.Linear(h, e, bias=False)
        self.w1 = nn.Parameter(torch.empty(e, h, f))
        self.w2 = nn.Parameter(torch.empty(e, f, h))
        self.w3 = nn.Parameter(torch.empty(e, h, f)) if self.gated else None
        self.shared = None
        if moe.n_shared_experts:
            self.shared = MLP(hidden=h, ffn=moe.n_shared_experts * moe.shared_width, activation=layer.activation,
                              bias=layer.bias)
        self.ep: ExpertGroup | None = None
        self.partial_over = 1
        """Ranks whose outputs sum to the true output (etp); the replicated shared experts are scaled by its
        inverse so the sum counts them once."""

    def expert_params(self) -> list[nn.Parameter]:
        """The stacked expert weights (sharded by expert parallelism, reduced apart from the rest)."""
        return [p for p in (self.w1, self.w2, self.w3) if p is not None]

    def shard_experts(self, ep: ExpertGroup, *, etp: int = 1, etp_rank: int = 0) -> None:
        """Keep only this rank's ``n_experts / ep.size`` experts and, with etp > 1, its 1/etp slice of their FFN
        width (weights already initialized in full)."""
        n_local = self.n_experts // ep.size
        lo = ep.rank * n_local
        for name in ("w1", "w2", "w3"):
            p = getattr(self, name)
            if p is not None:
                w = p.detach()[lo:lo + n_local]
                ffn_dim = 1 if name == "w2" else 2
                w = w.chunk(etp, dim=ffn_dim)[etp_rank]
                setattr(self, name, nn.Parameter(w.clone()))
        self.ep = ep if ep.size > 1 else None
        self.partial_over = etp

    def _experts(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Run tokens grouped by local expert (``counts[i]`` rows for expert i) through their experts."""
        # Expert weights are left out of FSDP (they shard over ep), so under bf16 they are cast here, as Megatron
        # keeps bf16 expert weights beside fp32 master copies (a no-op in fp32).
        w1, w2 = _local(self.w1).to(x.dtype), _local(self.w2).to(x.dtype)
        w3 = _local(self.w3).to(x.dtype) if self.w3 is not None else None
        outs = []
        for i, chunk in enumerate(torch.split(x, counts)):
            h = activate(self.activation, chunk @ w1[i])
            if w3 is not None:
                h = h * (chunk @ w3[i])
            outs.append(h @ w2[i])
        return torch.cat(outs) if outs else x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        probs = torch.softmax(self.router(flat).float(), dim=-1)
        weights, experts = probs.topk(self.top_k, dim=-1)
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        order = torch.argsort(experts.flatten(), stable=True)
        token = order // self.top_k
        routed = self.run_routed(flat[token], experts)
        out = torch.zeros_like(flat).index_add(0, token, routed * weights.flatten()[order, None])
        if self.shared is not None:
            shared = self.shared(flat)
            out = out + (shared / self.partial_over if self.partial_over > 1 else shared)
        return out.view(shape)

    def run_routed(self, routed: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """Expert outputs for the expert-sorted token copies ``routed``; ``experts`` holds each copy's expert
        (memcheck replaces this step with an even split, since fake tensors carry no counts)."""
        counts = torch.bincount(experts.flatten(), minlength=self.n_experts)
        if self.ep is None:
            return self._experts(routed, counts.tolist())
        return _dispatch_and_run(self, routed, counts)


def _local(w: torch.Tensor) -> torch.Tensor:
    """This rank's experts of a weight that expert parallelism turned into a DTensor."""
    return w.to_local() if hasattr(w, "to_local") else w


def _dispatch_and_run(moe: MoE, routed: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Send expert-sorted tokens to their experts' ranks, run the local experts, send the results back."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd

    ep = moe.ep
    n_local = moe.n_experts // ep.size
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts, group=ep.group)
    send_splits = counts.view(ep.size, n_local).sum(1).tolist()
    recv_matrix = recv_counts.view(ep.size, n_local)
    recv_splits = recv_matrix.sum(1).tolist()
    got = all_to_all_single_autograd(routed, recv_splits, send_splits, ep.group)
    # Received rows are ordered (source rank, local expert); regroup them by local expert.
    src_expert = torch.arange(n_local).repeat(ep.size).repeat_interleave(recv_matrix.flatten().cpu())
    regroup = torch.argsort(src_expert.to(got.device), stable=True)
    done = moe._experts(got[regroup], recv_matrix.sum(0).tolist())
    back = torch.empty_like(done).index_copy(0, regroup, done)
    return all_to_all_single_autograd(back, send_splits, recv_splits, ep.group)
