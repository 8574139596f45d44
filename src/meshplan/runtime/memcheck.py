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


def _balanced_run_routed(self, routed: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """``MoE.run_routed`` with routing counts fixed to an even split (fake tensors carry no values to count);
    the allocations mirror the real step: expert GEMMs and the two all-to-alls."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd

    rows = routed.shape[0]
    if self.ep is None:
        return self._experts(routed, _even(rows, self.n_experts))
    ep = self.ep
    splits = _even(rows, ep.size)
    got = all_to_all_single_autograd(routed, splits, splits, ep.group)
    # The real dispatch regroups received rows by local expert and back: two copies, kept for their memory.
    regroup = torch.arange(got.shape[0], device=got.device)
    done = self._experts(got[regroup], _even(got.shape[0], self.n_experts // ep.size))
    back = torch.empty_like(done).index_copy(0, regroup, done)
    return all_to_all_single_autograd(back, splits, splits, ep.group)


class _FusedRMSNorm(torch.autograd.Function):
    """What CUDA's fused ``aten._fused_rms_norm`` keeps for backward: the input and fp32 rstd per row. The CPU
    build has no such kernel, and its composite RMSNorm saves two fp32 copies of the input (16 h bytes per
    token per norm), which a GPU run does not."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return ((xf * rstd).to(x.dtype) * weight).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        xf, g = x.float(), grad.float()
        norm = xf * rstd
        gw = (g * norm).flatten(0, -2).sum(0).to(weight.dtype)
        gn = g * weight.float()
        gx = rstd * (gn - norm * (gn * norm).mean(-1, keepdim=True))
        return gx.to(x.dtype), gw, None


def _fused_rms_forward(self, x: torch.Tensor) -> torch.Tensor:
    return _FusedRMSNorm.apply(x, self.weight, self.eps)


def _simulate_gpu_kernels(parts) -> None:
    """Give every RMSNorm the CUDA fused kernel's saved tensors (the CPU composite saves more)."""
    for part in parts:
        for m in part.modules():
            if isinstance(m, torch.nn.RMSNorm):
                m.forward = types.MethodType(_fused_rms_forward, m)


def _propagate_outside_fake_mode(real):
    """DTensor's sharding propagation runs each op once on global-shape fake tensors to learn its output's
    metadata, under ``detect_fake_mode()``. On a GPU that is a private fake mode the allocator never sees; here
    it would be memcheck's own mode, which MemTracker tracks: loss parallel's log-softmax alone then adds two
    full-vocabulary fp32 tensors (8 GiB for Llama-3.1-8B at 8192 tokens) to the peak. Run it as on a GPU."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    def propagate(self, op_schema):
        with unset_fake_temporarily():
            return real(self, op_schema)
    return propagate


def _even(n: int, k: int) -> list[int]:
    base, rem = divmod(n, k)
    return [base + (i < rem) for i in range(k)]


def _balance_moe(parts) -> None:
    from meshplan.runtime.models.moe import MoE

    for part in parts:
        for m in part.modules():
            if isinstance(m, MoE):
                m.run_routed = types.MethodType(_balanced_run_routed, m)


def pipeline_order(plan: Plan, pp_rank: int) -> list[tuple[str, int]]:
    """(``F`` or ``B``, micro-batch) actions of ``pp_rank`` in the plan's schedule, from its generator in the
    simulator (``meshplan.sim.get_schedule``); memcheck runs one stage per rank with whole backwards."""
    from meshplan.sim import get_schedule
    from meshplan.sim.actions import FORWARD, FULL_BACKWARD

    sched = get_schedule(plan.schedule_name, pp=plan.pp, vpp=plan.vpp, n_micro=plan.n_micro)
    acts = sched.actions[pp_rank]
    if plan.vpp != 1 or any(a.kind not in (FORWARD, FULL_BACKWARD) for a in acts):
        raise ValueError(f"memcheck measures one stage per rank with whole backwards (gpipe, 1f1b), not "
                         f"{plan.schedule_name} with vpp={plan.vpp}")
    return [("F" if a.kind == FORWARD else "B", a.microbatch) for a in acts]


def _stage_input(t, xm: torch.Tensor) -> torch.Tensor:
    """What a stage receives: token ids on the first stage, else the previous stage's hidden states (this tp
    rank's sequence shard under SP, bf16 under bf16)."""
    part, plan = t.parts[0], t.cfg.plan
    if part.first:
        return xm
    seq = xm.shape[1] // (plan.tp if plan.sp else 1)
    dtype = torch.bfloat16 if t.bf16 else torch.float32
    return torch.empty(xm.shape[0], seq, t.spec.hidden, dtype=dtype, device=t.device, requires_grad=True)


def _pipeline_forward_backward(t, x: torch.Tensor, y: torch.Tensor) -> None:
    """A pipeline rank's step without torch.distributed.pipelining (its shape inference and p2p read tensor
    values fake tensors lack): the stage module runs the schedule's forwards and backwards in the schedule's
    order, with FSDP's per-micro-batch flags set as the pipelining runtime sets them (no reshard after backward
    nor gradient reduction before the last backward; gradients accumulate unsharded meanwhile)."""
    from meshplan.runtime.build import loss_context, loss_fn

    plan, part = t.cfg.plan, t.parts[0]
    micro = list(zip(x.chunk(plan.n_micro), y.chunk(plan.n_micro)))
    held: dict[int, torch.Tensor] = {}
    with loss_context(t):
        for kind, i in pipeline_order(plan, t.meshes.rank_in("pp")):
            if kind == "F":
                out = part(_stage_input(t, micro[i][0]))
                held[i] = loss_fn(out, micro[i][1]) / plan.n_micro if part.last else out
                continue
            last = i == plan.n_micro - 1
            if hasattr(part, "set_requires_gradient_sync"):
                part.set_is_last_backward(last)
                part.set_reshard_after_backward(last)
                part.set_requires_gradient_sync(last)
            out = held.pop(i)
            out.backward() if part.last else out.backward(torch.ones_like(out))


def _step(t, *, step: int) -> None:
    """One optimizer step as ``train.train_step`` runs it on a GPU, minus clipping and the loss readout
    (both read tensor values, which fake tensors do not have)."""
    from meshplan.runtime.build import sync_expert_grads
    from meshplan.runtime.train import _forward_backward, _local_batch

    x, y = _local_batch(t, step)
    for opt in t.optimizers:
        opt.zero_grad(set_to_none=True)
    if t.schedule is not None:
        _pipeline_forward_backward(t, x, y)
    else:
        _forward_backward(t, x, y)
    sync_expert_grads(t)
    for opt in t.optimizers:
        opt.step()


def _build(cfg: RunConfig, spec: ModelSpec, meshes, ep_mesh):
    """The runtime's trainer for this rank, on fake tensors (``meshes`` and ``ep_mesh`` are built before fake
    mode: they read real rank tensors)."""
    from unittest import mock

    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from meshplan.runtime import build, parallelize
    from meshplan.runtime.build import build_trainer
    from meshplan.runtime.models.decoder import Decoder

    def outside_fake_mode(real):
        # FSDP2 over TP DTensors slices the (real) rank tensor of the mesh, and the tied-embedding groups are cut
        # from it too; the parameters stay fake anyway.
        def call(*args, **kwargs):
            with unset_fake_temporarily():
                return real(*args, **kwargs)
        return call

    # Module.to() on fake parameters swaps tensors, which fake tensors refuse; the parts are already on the
    # (fake) CPU, so the move is a no-op anyway.
    with mock.patch.object(Decoder, "to", lambda self, *a, **k: self), \
            mock.patch.object(parallelize, "apply_fsdp", outside_fake_mode(parallelize.apply_fsdp)), \
            mock.patch.object(build, "_tied_sync", outside_fake_mode(build._tied_sync)):
        return build_trainer(cfg, spec, meshes, torch.device("cpu"), bf16=cfg.plan.precision == "bf16",
                             ep_mesh=ep_mesh)


def measure_rank(spec: ModelSpec, plan: Plan, *, rank: int, model_ref: str = "") -> Measured:
    """Peak tracked memory of global ``rank`` over a steady-state training step of ``plan``."""
    from unittest import mock

    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType
    from torch.distributed.tensor._sharding_prop import ShardingPropagator
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=rank, world_size=plan.n_gpus, store=FakeStore())
    try:
        from meshplan.runtime.mesh import build_meshes

        cfg = RunConfig(plan=plan, model=model_ref or spec.name)
        from meshplan.runtime.build import expert_mesh

        meshes = build_meshes(plan, "cpu")
        ep_mesh = expert_mesh(meshes, "cpu") if spec.is_moe and plan.ep * plan.etp > 1 else None
        real = ShardingPropagator._propagate_tensor_meta_non_cached
        with FakeTensorMode(), mock.patch.object(ShardingPropagator, "_propagate_tensor_meta_non_cached",
                                                 _propagate_outside_fake_mode(real)):
            t = _build(cfg, spec, meshes, ep_mesh)
            _balance_moe(t.parts)
            _simulate_gpu_kernels(t.parts)
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
