"""Memory truth: one rank of the real runtime (model, TP/FSDP/PP/EP wiring, optimizer) runs training steps on
fake tensors under a fake process group, and PyTorch's ``MemTracker`` records what it would allocate.

Nothing is allocated and no GPU is needed: FakeTensorMode gives every tensor its shape, dtype and storage size
without data, and the ``fake`` backend answers every collective at once. The run uses the dtypes a GPU run
of the runtime uses (fp32 parameters, gradients and AdamW states; bf16 autocast for compute), on the CPU
device type since a CPU-only PyTorch cannot place even fake tensors on ``cuda``.

Two steps run: the first creates AdamW's states (lazily, as on a GPU), the second is tracked, so the peak is
the steady state a long run sees. Known departures from a GPU run, each small and named in the output:
gradient clipping is skipped (its norms are scalars; scaling is in place), and MoE routing is balanced (fake
tensors have no values to route by; the cost model assumes balance too).
"""

from __future__ import annotations

import contextlib
import types
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from meshplan.runtime.config import RunConfig
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import Plan


@dataclass(frozen=True, kw_only=True)
class Measured:
    """Tracked bytes of one rank at its peak (steady-state training step)."""

    params: float
    """Parameters (sharded where FSDP/TP/EP shard them) (bytes)."""
    grads: float
    """Gradients live at the peak (bytes)."""
    optimizer: float
    """AdamW states (bytes)."""
    activations: float
    """Everything else live at the peak: saved activations, unsharded FSDP units, logits, temporaries (bytes)."""
    peak: float
    """Total tracked bytes at the peak (bytes)."""
    rank: int
    """Global rank measured."""


def with_layers(spec: ModelSpec, n_layers: int) -> ModelSpec:
    """The model with ``n_layers`` layers in its (single) block: CI-sized checks compare per-layer physics."""
    if not n_layers:
        return spec
    return replace(spec, blocks=tuple(replace(b, n_layers=n_layers) for b in spec.blocks))


def rank_of_stage(plan: Plan, stage: int) -> int:
    """The first global rank of pipeline rank ``stage`` under the plan's rank order."""
    return stage * plan.stride("pp")


def _balanced_moe_forward(self, x: torch.Tensor) -> torch.Tensor:
    """``MoE.forward`` with routing counts fixed to an even split (fake tensors carry no values to count).
    Allocations mirror the real forward: router, top-k, sorted copies, expert GEMMs, all-to-alls, combine."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd

    shape = x.shape
    flat = x.reshape(-1, shape[-1])
    probs = torch.softmax(self.router(flat).float(), dim=-1)
    weights, experts = probs.topk(self.top_k, dim=-1)
    weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
    order = torch.argsort(experts.flatten(), stable=True)
    token = order // self.top_k
    routed = flat[token]
    rows = routed.shape[0]
    if self.ep is None:
        routed = self._experts(routed, _even(rows, self.n_experts))
    else:
        ep = self.ep
        splits = _even(rows, ep.size)
        got = all_to_all_single_autograd(routed, splits, splits, ep.group)
        regroup = torch.arange(got.shape[0], device=got.device)
        done = self._experts(got[regroup], _even(got.shape[0], self.n_experts // ep.size))
        back = torch.empty_like(done).index_copy(0, regroup, done)
        routed = all_to_all_single_autograd(back, splits, splits, ep.group)
    out = torch.zeros_like(flat).index_add(0, token, routed * weights.flatten()[order, None])
    if self.shared is not None:
        out = out + self.shared(flat)
    return out.view(shape)


def _even(n: int, k: int) -> list[int]:
    base, rem = divmod(n, k)
    return [base + (i < rem) for i in range(k)]


def _balance_moe(parts) -> None:
    from meshplan.runtime.models.moe import MoE

    for part in parts:
        for m in part.modules():
            if isinstance(m, MoE):
                m.forward = types.MethodType(_balanced_moe_forward, m)


def _step(t, *, step: int, cache: bool = True) -> None:
    """One optimizer step as ``train.train_step`` runs it on a GPU, minus clipping and the loss readout
    (both read tensor values, which fake tensors do not have)."""
    from meshplan.runtime.build import sync_expert_grads
    from meshplan.runtime.train import _forward_backward, _local_batch

    x, y = _local_batch(t, step)
    for opt in t.optimizers:
        opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=cache) if t.cfg.plan.precision == "bf16" else contextlib.nullcontext():
        _forward_backward(t, x, y)
    sync_expert_grads(t)
    for opt in t.optimizers:
        opt.step()


def _build(cfg: RunConfig, spec: ModelSpec, meshes):
    """The runtime's trainer for this rank, on fake tensors (``meshes`` are built before fake mode: they read
    real rank tensors)."""
    from unittest import mock

    from meshplan.runtime.build import build_trainer
    from meshplan.runtime.models.decoder import Decoder

    # Module.to() on fake parameters swaps tensors, which fake tensors refuse; the parts are already on the
    # (fake) CPU, so the move is a no-op anyway.
    with mock.patch.object(Decoder, "to", lambda self, *a, **k: self):
        return build_trainer(cfg, spec, meshes, torch.device("cpu"))


def measure_rank(spec: ModelSpec, plan: Plan, *, rank: int, model_ref: str = "") -> Measured:
    """Peak tracked memory of global ``rank`` over a steady-state training step of ``plan``."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=rank, world_size=plan.n_gpus, store=FakeStore())
    try:
        from meshplan.runtime.mesh import build_meshes

        cfg = RunConfig(plan=plan, model=model_ref or spec.name)
        meshes = build_meshes(plan, "cpu")
        with FakeTensorMode():
            t = _build(cfg, spec, meshes)
            _balance_moe(t.parts)
            _step(t, step=1)
            tracker = MemTracker()
            # Per-module snapshots refuse a module called more than once per step (pipeline micro-batches);
            # only the device-wide peak is needed, so the module hooks are turned off.
            for hook in ("_pre_fw_hook", "_post_fw_hook", "_pre_bw_hook", "_post_bw_hook"):
                setattr(tracker, hook, lambda *a, **k: None)
            tracker.track_external(*t.parts, *t.optimizers)
            with tracker:
                _step(t, step=2)
            snap = next(iter(tracker.get_tracker_snapshot("peak").values()))
    finally:
        dist.destroy_process_group()
    get = lambda k: float(snap.get(k, 0))  # noqa: E731
    return Measured(params=get(_MemRefType.PARAM), grads=get(_MemRefType.GRAD), optimizer=get(_MemRefType.OPT),
                    activations=get(_MemRefType.ACT) + get(_MemRefType.TEMP) + get(_MemRefType.BUFFER),
                    peak=float(snap["Total"]), rank=rank)
