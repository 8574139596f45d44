"""One pipeline rank's share of a training step: its chunks' compute and exposed traffic, its data-parallel
and optimizer cost, and its peak memory, aggregated from the per-layer costs (``cost.stage``)."""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.cost.dp import DPCost, dp_cost, optimizer_time
from meshplan.cost.memory import RankLoad, rank_memory
from meshplan.cost.pipeline import inflight_microbatches, stage_rank
from meshplan.cost.result import MemoryBreakdown, StageTimes
from meshplan.cost.stage import Ctx, LayerCost, embedding_params, stage_params
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import Plan
from meshplan.spec.schedules import rank_stages


@dataclass(frozen=True, kw_only=True)
class RankCost:
    """One pipeline rank, all its chunks, per micro-batch unless said otherwise."""

    compute: float
    """Forward + backward compute (s)."""
    recompute: float
    """Recompute part of compute (s)."""
    host_wait: float
    """Part of compute the device waits on the host (s)."""
    tp: float
    """Exposed TP (s)."""
    cp: float
    """Exposed CP (s)."""
    ep: float
    """Exposed EP (s)."""
    dp: DPCost
    """Data-parallel cost."""
    optimizer: float
    """Optimizer step (s, once per step)."""
    memory: MemoryBreakdown
    """Peak memory."""


def rank_of(plan: Plan, stage: int) -> int:
    """Pipeline rank holding a virtual stage under the plan's schedule (looped, or V-shaped for zbv and
    dualpipev)."""
    return stage_rank(plan.schedule_name, stage=stage, pp=plan.pp)


def stages_of(plan: Plan, rank: int) -> tuple[int, ...]:
    """Virtual stages held by a pipeline rank, in pipeline order (cached per placement)."""
    return rank_stages(plan.schedule_name, pp=plan.pp, n_stages=plan.n_stages)[rank]


def rank_cost(model: ModelSpec, plan: Plan, r: int, *, costs: list[list[LayerCost]], times: StageTimes,
              stages: list, ctx: Ctx) -> RankCost:
    """Aggregate the chunks of pipeline rank ``r``."""
    idx = stages_of(plan, r)
    rows = [c for v in idx for c in costs[v]]
    layers = [lay for v in idx for lay in stages[v]]
    first, last = 0 in idx, plan.n_stages - 1 in idx
    dense, expert = stage_params(model, layers, plan, first=first, last=last)
    fwd = bwd = act_one = 0.0
    for v in idx:
        fwd += times.fwd[v]
        bwd += times.bwd_input[v] + times.bwd_weight[v]
        act_one += times.act_bytes[v]
    compute = recompute = host_wait = tp = cp = ep = 0.0
    n_tensors = 2  # layers' tensors, plus embedding/head and final norm
    for c in rows:
        compute += c.fwd + c.bwd_input + c.bwd_weight
        recompute += c.recompute
        host_wait += c.host_wait
        tp += c.tp_f + c.tp_b
        cp += c.cp_f + c.cp_b
        ep += c.ep_f + c.ep_b
        n_tensors += c.n_params
    dp = dp_cost(dense, expert, plan=plan, stack=ctx.stack, links=ctx.links, calib=ctx.calib, fwd=fwd, bwd=bwd,
                 n_units=max(len(rows), 1), n_tensors=n_tensors)
    inflight = inflight_microbatches(plan.schedule_name, pp=plan.pp, vpp=plan.vpp, n_micro=plan.n_micro, rank=r)
    act = inflight * act_one
    extra = max((c.full_act_bytes - c.act_bytes for c in rows), default=0.0)
    load = RankLoad(dense=dense, expert=expert, act=act, act_one=act_one, recompute=extra,
                    root=root_params(model, plan, first, last), n_units=len(rows), first=first, last=last)
    mem = rank_memory(model, plan, ctx.stack, load, generation=ctx.gpu.generation)
    # Sharded (ZeRO/FSDP2) and tensor-parallel parameters are DTensors: their optimizer ops pay dispatch too.
    host = ctx.calib.op_overhead_s + (ctx.calib.dtensor_overhead_s if (plan.zero or plan.tp > 1) else 0.0)
    opt = optimizer_time(dense, expert, plan=plan, stack=ctx.stack, hbm_bandwidth=ctx.gpu.hbm_bandwidth,
                         mem_eff=ctx.calib.mem_eff, n_tensors=n_tensors, host_s=host, host_floor_s=ctx.calib.host_op_s)
    return RankCost(compute=compute, recompute=recompute, host_wait=host_wait, tp=tp, cp=cp, ep=ep, dp=dp,
                    optimizer=opt, memory=mem)


def root_params(model: ModelSpec, plan: Plan, first: bool, last: bool) -> float:
    """Embedding and output-head parameters a rank holds in FSDP's root unit (``embedding_params``, without the
    MTP module's copy, which lives in the MTP block)."""
    return embedding_params(model, plan, first=first, last=last, mtp=False)
