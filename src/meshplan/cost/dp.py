"""Data-parallel, ZeRO and FSDP traffic and its overlap with compute.

ZeRO (Rajbhandari et al. 2020, sec. 7): stage 0 all-reduces gradients (2 Psi), stages 1-2 reduce-scatter
gradients and all-gather updated parameters (same volume), stage 3 all-gathers parameters in forward and again
in backward and reduce-scatters gradients (3 Psi), every micro-batch under FSDP2.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.cost.comm import Links, collective_time
from meshplan.cost.dp_sync import SyncContext, sync_method
from meshplan.cost.memory import accumulates_unsharded, bytes_per_param
from meshplan.cost.memory_stack import DS_MAX_REUSE
from meshplan.spec.calibration import Calibration
from meshplan.spec.cluster import GroupLink
from meshplan.spec.framework import FrameworkProfile
from meshplan.spec.plan import Plan

# Megatron's DDP bucket: max(40M, 1M x dp) parameters (megatron/core/distributed/distributed_data_parallel.py).
BUCKET_PARAMS = 40e6


@dataclass(frozen=True, kw_only=True)
class DPCost:
    """Data-parallel time of one pipeline rank (s)."""

    per_micro_fwd: float = 0.0
    """Exposed FSDP all-gathers per micro-batch in forward."""
    per_micro_bwd: float = 0.0
    """Exposed FSDP all-gathers and reduce-scatters per micro-batch in backward."""
    per_step: float = 0.0
    """Exposed gradient reduction / parameter gather once per step (after the last backward)."""
    total_traffic: float = 0.0
    """All DP communication time before overlap, per step (informative)."""


def on_any(stack: FrameworkProfile) -> bool:
    """The stack overlaps some DP/FSDP traffic."""
    return stack.overlap_param_gather or stack.overlap_grad_reduce


def fsdp_cost(dense: float, expert: float, *, plan: Plan, stack: FrameworkProfile, links: Links,
              calib: Calibration, fwd: float, bwd: float, n_units: int, n_tensors: int = 0) -> DPCost:
    """ZeRO-3/FSDP2 per micro-batch: all-gather bf16 parameters before forward and again before backward
    (reshard after forward), reduce-scatter fp32 gradients; prefetching hides them behind the previous
    unit's compute except the first unit. HSDP adds a once-per-step all-reduce of the sharded gradients
    across replicas. ``n_tensors``: parameter tensors on the rank, each its own collective when
    the stack's ``zero_gather`` is ``param``."""
    shard = plan.zero_group
    units = max(n_units, 1)
    calls = max(n_tensors, units) if stack.zero_gather == "param" else units
    w_bytes = 2.0 if plan.precision != "fp32" else 4.0
    # torchao's float8 all-gather casts each linear weight's shard to fp8 first (float8/fsdp_utils.py
    # fsdp_pre_all_gather): 1 byte per dense weight; the experts' grouped weights stay 16-bit.
    dense_bytes = 1.0 if plan.precision == "fp8" and stack.fp8_fsdp_gather else w_bytes

    def per_unit(kind: str, params: float, nbytes: float, size: int, link) -> float:
        # One collective per FSDP unit (a layer), or per parameter tensor (DeepSpeed 2021, partition_parameters
        # ._allgather_param / ._reduce_scatter_gradient): the latency term is paid once per call.
        return calls * collective_time(kind, params * nbytes / calls, size=size, link=link, calib=calib)

    ag = per_unit("all_gather", dense, dense_bytes, shard, links.dp_shard)
    rs = per_unit("reduce_scatter", dense, 4.0, shard, links.dp_shard)
    if expert:
        eg = plan.expert_dp
        ag += per_unit("all_gather", expert, w_bytes, eg, links.dp)
        rs += per_unit("reduce_scatter", expert, 4.0, eg, links.dp)
    if plan.pp > 1 and plan.n_micro > 1:
        # Under a pipeline schedule FSDP2 keeps parameters unsharded across micro-batches and syncs gradients
        # only on the last backward (torch.distributed.pipelining; torchtitan's reshard policy for PP):
        # one gather and one reduce-scatter per step.
        per_step = max(ag + rs - calib.overlap_eff * (fwd + bwd), (ag + rs) / units) if on_any(stack) else ag + rs
        return DPCost(per_step=per_step, total_traffic=ag + rs)
    on = stack.overlap_param_gather
    f = max(ag - calib.overlap_eff * fwd, ag / units) if on else ag
    bag = ag * backward_gathers(dense / units, plan=plan, stack=stack)
    b = max(bag + rs - calib.overlap_eff * bwd, (bag + rs) / units) if on else bag + rs
    # Each unit's blocking calls (one gather in forward; gather and reduce-scatter in backward) cost the host
    # a synchronisation that no overlap hides (sync_s, measured by `meshplan calibrate`; 0 on GPUs).
    f += calls * calib.sync_s
    b += 2 * calls * calib.sync_s
    rep = plan.dp_replicate
    ar = collective_time("all_reduce", dense / shard * 4.0, size=rep, link=links.dp_replicate, calib=calib)
    per_step = max(ar - calib.overlap_eff * bwd, 0.0) if stack.overlap_grad_reduce else ar
    return DPCost(per_micro_fwd=f, per_micro_bwd=b, per_step=per_step,
                  total_traffic=(ag + bag + rs) * plan.n_micro + ar)


def backward_gathers(unit_params: float, *, plan: Plan, stack: FrameworkProfile) -> int:
    """All-gathers of a unit's parameters in its backward. FSDP gathers once, before the unit's backward, and its
    recompute runs on the gathered parameters. DeepSpeed ZeRO-3 hooks every sub-module's forward, the recompute's
    too (v0.5.0 stage3.py pre/post_sub_module_forward_function fetch and release), and keeps a parameter until its
    backward only within max_reuse_distance elements (``_keep_for_later``): a recomputed layer larger than that
    is gathered for its recompute and again for its backward."""
    again = stack.sharding == "deepspeed_zero" and plan.recompute == "full" and unit_params > DS_MAX_REUSE
    return 2 if again else 1


def ddp_cost(dense: float, expert: float, *, plan: Plan, stack: FrameworkProfile, links: Links,
             calib: Calibration, fwd: float, bwd: float) -> DPCost:
    """ZeRO 0-2 once per step: gradients reduced during the last micro-batch's backward (overlap_grad_reduce,
    bucketed), updated bf16 parameters gathered during the next forward (overlap_param_gather). The last
    bucket cannot hide."""
    _, g_bytes, _ = bytes_per_param(plan, stack)
    group = plan.dp * plan.cp
    sync, ctx = sync_method(plan.sync), sync_context(plan, links)

    def reduce(params: float, size: int) -> float:
        return sync.reduce(params * g_bytes, size=size, link=links.dp, calib=calib, ctx=ctx)

    red = reduce(dense, group)
    bucket = reduce(min(BUCKET_PARAMS, dense), group)
    gather = bucket_g = 0.0
    if plan.zero:
        w_bytes, _, _ = bytes_per_param(plan, stack)
        gather = collective_time("all_gather", dense * w_bytes, size=group, link=links.dp, calib=calib)
        bucket_g = collective_time("all_gather", min(BUCKET_PARAMS, dense) * w_bytes, size=group, link=links.dp,
                                   calib=calib)
    if expert:
        eg = plan.expert_dp
        red += reduce(expert, eg)
        if plan.zero:
            gather += collective_time("all_gather", expert * w_bytes, size=eg, link=links.dp, calib=calib)
    exp_red = max(red - calib.overlap_eff * bwd, bucket) if stack.overlap_grad_reduce else red
    exp_gat = max(gather - calib.overlap_eff * fwd, bucket_g) if stack.overlap_param_gather else gather
    if reduces_every_micro(plan, stack):
        # Sharded gradients cannot accumulate unsharded: every micro-batch's backward reduce-scatters into the
        # shard (Megatron-FSDP optim_grads: grad_reduce_every_bprop in megatron_fsdp.py; DeepSpeed ZeRO-2
        # stage_1_and_2.py reduces at every backward), hidden behind that micro-batch's backward but its last bucket.
        return DPCost(per_micro_bwd=exp_red, per_step=exp_gat, total_traffic=red * plan.n_micro + gather)
    return DPCost(per_step=exp_red + exp_gat, total_traffic=red + gather)


def sync_context(plan: Plan, links: Links) -> SyncContext:
    """The dp group as the synchronisation method sees it: machines it spans, the share of the cluster's server
    bandwidth it gets (every dp x cp group reduces at the same time), its members' scale-out bandwidth."""
    if links.servers is None:
        servers = float("inf")
    else:
        servers = links.servers / max(plan.n_gpus // (plan.dp * plan.cp), 1)
    return SyncContext(machines=links.dp.machines, servers=servers, machine_bandwidth=links.dp.bandwidth)


def reduces_every_micro(plan: Plan, stack: FrameworkProfile) -> bool:
    """ZeRO-2 whose gradients stay sharded while they accumulate (``cost.memory`` gives them the sharded size):
    the reduce-scatter runs after every micro-batch, not once per step. A stack that accumulates FSDP2
    gradients unsharded (``accumulates_unsharded``) holds them whole instead and reduces once."""
    return plan.zero == 2 and plan.n_micro > 1 and not accumulates_unsharded(plan, stack)


def dp_cost(dense: float, expert: float, *, plan: Plan, stack: FrameworkProfile, links: Links, calib: Calibration,
            fwd: float, bwd: float, n_units: int, n_tensors: int = 0) -> DPCost:
    """Data-parallel cost of one pipeline rank holding ``dense``/``expert`` parameters (``n_tensors`` tensors
    in ``n_units`` layers); ``fwd``/``bwd`` are its compute per micro-batch (s) that traffic can hide behind."""
    if plan.dp * plan.cp <= 1 and plan.shard_group <= 1 and not expert:
        return DPCost()
    if plan.zero == 3:
        return fsdp_cost(dense, expert, plan=plan, stack=stack, links=links, calib=calib, fwd=fwd, bwd=bwd,
                         n_units=n_units, n_tensors=n_tensors)
    return ddp_cost(dense, expert, plan=plan, stack=stack, links=links, calib=calib, fwd=fwd, bwd=bwd)


# AdamW per parameter tensor without multi-tensor apply: weight decay, two moment updates, bias corrections,
# sqrt, division and the update (torch.optim.adamw single-tensor path, ~10 ops).
ADAM_OPS_PER_TENSOR = 10


def optimizer_time(dense: float, expert: float, *, plan: Plan, stack: FrameworkProfile, hbm_bandwidth: float,
                   mem_eff: float, n_tensors: int = 0, host_s: float = 0.0, host_floor_s: float = 0.0) -> float:
    """Adam step, memory-bound: read fp32 master, m, v and gradient, write master, m, v and the 16-bit weight
    (``adam_bytes`` per locally owned parameter; multi-tensor apply), plus ``host_s`` of host overhead per op on
    ``n_tensors`` parameter tensors where it does not overlap (CPUs); on a GPU no shorter than issuing those
    ops at ``host_floor_s`` each (launches overlap the device: the slower sets the pace)."""
    local = owned_params(plan, dense=dense, expert=expert)
    ops = fused_adam_launches(n_tensors, local) if stack.fused_optimizer else n_tensors * ADAM_OPS_PER_TENSOR
    return max(adam_bytes(stack) * local / (hbm_bandwidth * mem_eff), ops * host_floor_s) + ops * host_s


def owned_params(plan: Plan, *, dense: float, expert: float) -> float:
    """Parameters whose optimizer states a rank updates: its dense ones over the ZeRO group and its experts over
    their share of it, the same division as their memory (``meshplan.cost.memory.sharded_state``)."""
    if not plan.zero:
        return dense + expert
    return dense / plan.zero_group + expert / plan.expert_zero_group


def adam_bytes(stack: FrameworkProfile) -> float:
    """HBM bytes the Adam step moves per locally owned parameter: read master, both moments and the gradient,
    write master and moments, write the 16-bit weight (4+4+4+4 + 4+4+4 + 2 = 30 in fp32; bf16 moments and
    gradients move 2 bytes each instead of 4)."""
    m = 2.0 if stack.optimizer_dtype == "bf16" else 4.0
    g = 2.0 if stack.grad_dtype == "bf16" else 4.0
    return 4.0 + 2 * m + g + 4.0 + 2 * m + 2.0


# Multi-tensor apply (apex csrc/multi_tensor_apply.cuh, used by Megatron's and TE's FusedAdam): one launch covers
# at most 36 tensors of a 4-list op (depth_to_max_tensors) and 320 chunks of 2048 x 32 elements
# (depth_to_max_blocks, Megatron's chunk size); a step runs about three such ops (unscale and norm, Adam, copy).
MTA_TENSORS, MTA_ELEMENTS, MTA_OPS = 36, 320 * 2048 * 32, 3


def fused_adam_launches(n_tensors: int, local_params: float) -> int:
    """Kernel launches of one multi-tensor-apply optimizer step on a rank."""
    return MTA_OPS * max(-(-n_tensors // MTA_TENSORS), int(-(-local_params // MTA_ELEMENTS)), 1)


def cross_pool_reduce(shard_bytes: float, *, pools: int, link: GroupLink, calib: Calibration) -> float:
    """Gradient all-reduce between the pools of a mixed cluster, once per step (s).

    Hierarchical all-reduce (Horovod's hierarchical allreduce; BlueConnect, Cho et al. 2019): reduce-scatter
    inside each pool, all-reduce of every GPU's shard (``shard_bytes``) across the ``pools``, all-gather inside
    each pool. The in-pool phases are the pools' own data-parallel cost; this is the cross-pool phase, ring bus
    factor 2(k-1)/k over ``link``. Not overlapped: it needs every replica's gradients, so it starts when the
    slowest replica's backward ends (HetPipe, Park et al. 2020, sec. 4: the step waits for the slowest worker).
    """
    return collective_time("all_reduce", shard_bytes, size=pools, link=link, calib=calib)
