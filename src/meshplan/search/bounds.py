"""Cheap lower bounds on step time and per-GPU memory of a leaf, from per-layer costs that are computed once
per (pool, tp, cp, micro-batch, cp kind, ep, etp) and shared by every pipeline depth, schedule, ZeRO stage and
data-parallel degree (identical layers cost the same).

Both bounds hold for any layer split, so search can discard a leaf before running the full cost model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property, lru_cache
from itertools import accumulate

from meshplan.cost.calib import gpu_calibration
from meshplan.cost.comm import collective_time, plan_links
from meshplan.cost.dp import DPCost, adam_bytes, dp_cost, owned_params
from meshplan.cost.memory import layer_params, reserved_bytes, static_floor
from meshplan.cost.pipeline import closed_form, inflight_microbatches
from meshplan.cost.result import StageTimes
from meshplan.cost.stage import Ctx, embedding_params, head_cost, layer_cost, tokens_of
from meshplan.spec.cluster import Pool, group_link
from meshplan.spec.framework import FrameworkProfile
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import Plan
from meshplan.spec.schedules import bound_factor, schedule_spec


@dataclass(frozen=True, kw_only=True)
class BlockCost:
    """One layer of a block on one rank, one micro-batch."""

    n_layers: int
    """Layers in the block."""
    work: float
    """Forward + backward time with exposed TP/CP/EP communication, no recompute (s)."""
    full_extra: float
    """Extra backward time under full recompute (s)."""
    sel_extra: float
    """Extra backward time under selective recompute (s)."""
    act: dict
    """Activation bytes kept for backward by recompute mode."""
    fwd: float
    """Forward part of work (s)."""
    share: float
    """Lower bound of a rank's zero-bubble fill per unit of work: max(F + I - W, I) / (F + I + W)."""
    dense: float
    """Dense parameters held by one rank (tp-sharded)."""
    expert: float
    """Expert parameters held by one rank (ep x etp-sharded)."""


@dataclass(frozen=True, kw_only=True)
class LayerTable:
    """Per-layer costs of a model under one (pool, tp, cp, micro-batch, cp kind, ep, etp)."""

    blocks: tuple[BlockCost, ...]
    """One entry per model block."""
    head: float
    """Output head forward + backward on the last stage (s)."""
    emb: float
    """Embedding (and separate output head) parameters per rank, summed."""
    fwd: float
    """Forward time of all layers and the head per micro-batch (s)."""
    bwd: float
    """Backward time of all layers and the head per micro-batch (s)."""
    opt_s_per_param: float
    """Optimizer step time per locally owned parameter (s)."""
    overhead: float
    """Fixed per-step overhead (s)."""
    reserved: float
    """CUDA context and NCCL buffers (bytes)."""
    stack: FrameworkProfile
    """The software stack the costs were computed under."""

    @cached_property
    def share(self) -> float:
        """Smallest zero-bubble fill share over the blocks (the head's is 1)."""
        return min(b.share for b in self.blocks)

    @cached_property
    def act_total(self) -> dict[str, float]:
        """Activation bytes of all layers for one micro-batch, by recompute mode."""
        return {mode: sum(b.act[mode] * b.n_layers for b in self.blocks) for mode in self.blocks[0].act}

    @cached_property
    def recompute_terms(self) -> tuple[float, float, float]:
        """(largest activation saving of one fully recomputed layer, least extra work of one, extra work of
        selective recompute on every layer) for ``recompute_extra``."""
        return (max(b.act["none"] - b.act["full"] for b in self.blocks), min(b.full_extra for b in self.blocks),
                sum(b.sel_extra * b.n_layers for b in self.blocks))

    @cached_property
    def work(self) -> float:
        """All layers' and the head's work per micro-batch (s)."""
        return sum(b.work * b.n_layers for b in self.blocks) + self.head

    @cached_property
    def dense(self) -> float:
        """Dense parameters per tp rank over all stages, embeddings included."""
        return sum(b.dense * b.n_layers for b in self.blocks) + self.emb

    @cached_property
    def prefix(self) -> dict[str, list[float]]:
        """Running sums of each layer's work, dense and expert parameters and forward time in layer order (index
        i: the layers before i), so a stage's sum is a difference of two."""
        owner = [b for b in self.blocks for _ in range(b.n_layers)]
        return {k: list(accumulate((getattr(x, k) for x in owner), initial=0.0))
                for k in ("work", "dense", "expert", "fwd")}

    @cached_property
    def expert(self) -> float:
        """Expert parameters per rank over all stages."""
        return sum(b.expert * b.n_layers for b in self.blocks)


def layer_table(model: ModelSpec, pool: Pool, plan: Plan, *, stack: FrameworkProfile, calib=None) -> LayerTable:
    """Cost every block once with the cost model's own layer function (``meshplan.cost.stage.layer_cost``)."""
    cal = gpu_calibration(pool.gpu, calib, library=stack.kernel_library)
    links = plan_links(plan, pool)
    ctxs = {mode: Ctx(model=model, plan=plan.with_(recompute=mode, recompute_layers=0), stack=stack, gpu=pool.gpu,
                      links=links, calib=cal) for mode in ("none", "selective", "full")}
    blocks, fwd, bwd = [], 0.0, 0.0
    for b in model.blocks:
        costs = {mode: layer_cost(b, ctx, index_on_rank=0) for mode, ctx in ctxs.items()}
        base, full = costs["none"], costs["full"]
        work, f, i = base.work, base.forward, base.backward_input
        full_extra = full.backward_input - i
        d, e = layer_params(b.layer)
        share = max(f + i - base.bwd_weight, i) / max(work, 1e-30)
        fwd += f * b.n_layers
        bwd += (work - f) * b.n_layers
        blocks.append(BlockCost(n_layers=b.n_layers, work=work, full_extra=full_extra, share=share, fwd=f,
                                sel_extra=costs["selective"].bwd_input - base.bwd_input,
                                act={m: c.act_bytes for m, c in costs.items()}, dense=d / plan.tp,
                                expert=e / (plan.ep * plan.etp)))
    hf, hb = head_cost(model, ctxs["none"])
    emb = embedding_params(model, plan, first=True, last=True, mtp=False)
    return LayerTable(blocks=tuple(blocks), head=hf + hb, emb=emb, fwd=fwd + hf, bwd=bwd + hb,
                      opt_s_per_param=adam_bytes(stack) / (pool.gpu.hbm_bandwidth * cal.mem_eff),
                      overhead=cal.step_overhead_s, reserved=reserved_bytes(pool.gpu.generation), stack=stack)


def pipeline_factor(schedule: str, *, pp: int, vpp: int, n_micro: int, share: float = 0.0) -> float:
    """Lower bound of pipeline time in units of the average rank's work per micro-batch, valid for any split: the
    schedule's closed form m M + c (S - M) + e M with M >= S / p (``meshplan.spec.schedules.bound_factor``).
    1F1B and GPipe: m + p - 1 (Narayanan et al. 2021 eq. 1); interleaved: m + (p - 1)/v + (v-1) max(p-m, 0)/v;
    zero-bubble fills per_r >= ``share`` W_r: m + share (p - 1), halved for the V-shaped schedules."""
    if pp == 1 or not schedule:
        return float(n_micro) if pp == 1 else bound_factor("1f1b", pp=pp, vpp=vpp, n_micro=n_micro)
    return bound_factor(schedule, pp=pp, vpp=vpp, n_micro=n_micro, share=share)


def mixed_pipeline_floor(layers: list[float], heads: list[float], least: list[float]) -> float:
    """Busiest rank's work per micro-batch for any layer split over ranks of different speed (s): rank r runs
    the share x_r of the layers in x_r L_r (``layers[r]``: all layers on its pool) plus its fixed ``heads[r]``,
    and holds at least ``least[r]`` of work. The continuous relaxation of the stage sizing (HAPT / Metis):
    sum_r (T - h_r) / L_r >= 1 gives T >= (1 + sum_r h_r / L_r) / sum_r 1 / L_r; and T >= h_r + least_r.

    Example: L = (1, 3) s, no head, no minimum: T = 1 / (1 + 1/3) = 0.75 s (x = 0.75, 0.25).
    """
    inv = sum(1.0 / max(L, 1e-30) for L in layers)
    fixed = sum(h / max(L, 1e-30) for h, L in zip(heads, layers))
    return max((1.0 + fixed) / inv, max(h + m for h, m in zip(heads, least)))


def mixed_schedule_bound(schedule: str, *, pp: int, vpp: int, n_micro: int, share: float, busiest: float,
                         total: float) -> float:
    """Pipeline time of any split whose busiest rank works at least ``busiest`` and all ranks together at least
    ``total`` per micro-batch (s). The closed forms are m M + c (S - M) + e M with M the busiest rank's and S all
    ranks' work (``ScheduleSpec.fill_coefficient``: c = 1 for 1F1B and GPipe, 1/v interleaved with e = (v-1)
    max(p-m, 0)/v, the zero-bubble share, halved for V-shaped schedules); increasing in M and S (m >= c), so
    M = max(busiest, total / p) and S = total bound it.

    Example: 1F1B, m = 8, M = 1.5 s, S = 2 s on p = 2: 7 x 1.5 + 2 = 12.5 s.
    """
    m, p = n_micro, pp
    M = max(busiest, total / p)
    if p == 1:
        return m * M
    c, e = schedule_spec(schedule).fill_coefficient(p, vpp, m, share)
    return (m - c + e) * M + c * total


def p2p_lower_bound(model: ModelSpec, pool: Pool, plan: Plan, *, calib) -> float:
    """Exposed pipeline sends on the critical path (s): the closed form's transfer term for the smallest
    activation any stage sends, over the link two pipeline neighbours share."""
    if plan.pp == 1:
        return 0.0
    return p2p_send_time(model, pool, plan, calib=calib) * p2p_factor(plan.schedule_name, pp=plan.pp,
                                                                      vpp=plan.vpp, n_micro=plan.n_micro)


def p2p_send_time(model: ModelSpec, pool: Pool, plan: Plan, *, calib) -> float:
    """The smallest activation send between pipeline neighbours (s); depends on the pool, the intra-layer
    layout and the pipeline stride only, so search caches it."""
    cal = gpu_calibration(pool.gpu, calib)  # link efficiencies only: no kernel-library constant enters
    link = group_link(pool, size=2, stride=plan.stride("pp"))
    h_div = plan.tp if plan.sp else 1
    return min(collective_time("send_recv", tokens_of(b, plan) * b.layer.hidden * 2.0 / h_div, size=2, link=link,
                               calib=cal) for b in model.blocks)


@lru_cache(maxsize=4096)
def p2p_factor(schedule: str, *, pp: int, vpp: int, n_micro: int) -> float:
    """Exposed transfer time per second of one stage-to-stage send: the closed form's transfer term
    (``meshplan.cost.pipeline.closed_form``), which is linear in the send time."""
    s = pp * vpp
    zeros = (0.0,) * s
    times = StageTimes(fwd=zeros, bwd_input=zeros, bwd_weight=zeros, p2p=(1.0,) * s, act_bytes=zeros)
    return closed_form(schedule, times, pp=pp, vpp=vpp, n_micro=n_micro).p2p


def _local_params(table: LayerTable, plan: Plan) -> tuple[float, float]:
    """(dense, expert) parameters of the average pipeline rank."""
    return table.dense / plan.pp, table.expert / plan.pp


def time_lower_bound(table: LayerTable, plan: Plan, *, p2p: float = 0.0, extra_work: float = 0.0,
                     dp: DPCost | None = None, pipe_floor: float = 0.0) -> float:
    """Step time can be no less than the pipeline bound on the average rank's work (plus ``extra_work`` per
    micro-batch summed over ranks, e.g. forced recompute), the exposed sends, the data-parallel cost when it
    is exact (one pipeline rank), the average rank's optimizer step (memory-bound, linear in owned
    parameters) and the fixed overhead (s). ``pipe_floor``: a tighter pipeline bound known for the split
    (``even_pipeline_bound``; it must already include any data-parallel tail it claims)."""
    # Recompute lengthens the backward, which hides more data-parallel traffic, but never by more than it adds.
    micro = dp.per_micro_fwd + dp.per_micro_bwd if dp is not None else 0.0
    work = table.work + (max(extra_work, micro) if extra_work > 0 else micro)
    if dp is not None and extra_work == 0:
        p2p += dp.per_step
    pipe = pipeline_factor(plan.schedule_name if plan.pp > 1 else "", pp=plan.pp, vpp=plan.vpp,
                           n_micro=plan.n_micro, share=table.share) * work / plan.pp
    pipe = max(pipe, pipe_floor) + p2p
    return pipe + _optimizer_bound(table, plan) + table.overhead


def _optimizer_bound(table: LayerTable, plan: Plan) -> float:
    """Optimizer step of the average rank (s): memory-bound, linear in the parameters it owns, so the
    slowest rank takes at least this long (``meshplan.cost.dp.optimizer_time``)."""
    dense, expert = _local_params(table, plan)
    return owned_params(plan, dense=dense, expert=expert) * table.opt_s_per_param


def group_time_bound(table: LayerTable, plan: Plan, *, m: int | None = None) -> float:
    """Bound shared by every schedule and virtual-stage count of a plan: m micro-batches (default the plan's)
    of the average rank's work with no bubble, the optimizer and the overhead (s)."""
    m = plan.n_micro if m is None else m
    return m * table.work / plan.pp + _optimizer_bound(table, plan) + table.overhead


def static_lower_bound(table: LayerTable, plan: Plan) -> float:
    """Memory of the average rank without activations (bytes): a bound for every schedule and recompute."""
    return _static_avg(table, plan)


def memory_lower_bound(table: LayerTable, plan: Plan, *, mode: str = "full") -> float:
    """Peak memory bound of the worst rank under recompute ``mode`` for every split (bytes). Static part:
    weights, gradients and optimizer states of the average rank after ZeRO sharding plus the CUDA context
    (mirrors ``meshplan.cost.memory.rank_memory``). With activations A (all layers, one micro-batch) and
    in-flight counts i_r, weighting rank r by 1/i_r gives max_r (S_r + i_r A_r) >= (sum S / i_max + A) /
    sum_r 1/i_r."""
    i_max, inv_sum = inflight_stats(plan.schedule_name, pp=plan.pp, vpp=plan.vpp, n_micro=plan.n_micro)
    return _memory_floor(table, mode, static=_static_avg(table, plan), pp=plan.pp, i_max=i_max, inv_sum=inv_sum)


def _memory_floor(table: LayerTable, mode: str, *, static: float, pp: int, i_max: float, inv_sum: float) -> float:
    """``memory_lower_bound`` from its schedule-independent static part and the schedule's in-flight counts."""
    act = table.act_total[mode]
    water = ((static - table.reserved) * pp / i_max + act) / inv_sum
    return max(static, water + table.reserved)


@lru_cache(maxsize=8192)
def inflight_stats(schedule: str, *, pp: int, vpp: int, n_micro: int) -> tuple[float, float]:
    """(max_r i_r, sum_r 1/i_r) of the in-flight micro-batches per rank (``inflight_microbatches``)."""
    if pp == 1:
        return 1.0, 1.0
    ins = [max(inflight_microbatches(schedule, pp=pp, vpp=vpp, n_micro=n_micro, rank=r), 1e-9) for r in range(pp)]
    return max(ins), sum(1 / i for i in ins)


def _static_avg(table: LayerTable, plan: Plan) -> float:
    """Weights, gradients, optimizer states and context of the average rank (bytes): the cost model's static floor
    (``meshplan.cost.memory.static_floor``) of its parameters."""
    dense, expert = _local_params(table, plan)
    return static_floor(plan, table.stack, dense=dense, expert=expert) + table.reserved


def recompute_extra(table: LayerTable, plan: Plan, *, limit: float, selective: bool = True) -> float | None:
    """Least extra work per micro-batch, summed over pipeline ranks, that any recompute choice able to fit in
    ``limit`` bytes adds (s): 0 when no recompute may be needed; else the cheaper of selective recompute of
    every layer (if its memory bound fits) and full recompute of the fewest layers per rank that the memory
    bound allows; None when even full recompute cannot fit."""
    i_max, inv_sum = inflight_stats(plan.schedule_name, pp=plan.pp, vpp=plan.vpp, n_micro=plan.n_micro)
    return _extra(table, static=_static_avg(table, plan), pp=plan.pp, i_max=i_max, inv_sum=inv_sum, limit=limit,
                  selective=selective)


def _extra(table: LayerTable, *, static: float, pp: int, i_max: float, inv_sum: float, limit: float,
           selective: bool) -> float | None:
    """``recompute_extra`` from the static memory and the schedule's in-flight counts."""
    def mem(mode: str) -> float:
        return _memory_floor(table, mode, static=static, pp=pp, i_max=i_max, inv_sum=inv_sum)

    none = mem("none")
    if none <= limit:
        return 0.0
    if mem("full") > limit:
        return None
    # Each fully recomputed layer saves at most the largest per-layer difference, k layers on every rank.
    save, full_extra, sel_extra = table.recompute_terms
    k = max(1, math.ceil((none - limit) * inv_sum / max(pp * save, 1e-30) - 1e-9))
    opts = [pp * k * full_extra]
    if selective and mem("selective") <= limit:
        opts.append(sel_extra)
    return min(opts)


def group_pipeline_floor(table: LayerTable, plan: Plan, pipelines, *, limit: float, selective: bool = True,
                         static: float | None = None) -> float | None:
    """Pipeline part of the leaf bound (``time_lower_bound`` without sends or data-parallel terms) minimized
    over a group's (schedule, vpp) options, each with the least recompute its memory bound allows (s); None
    when no option can fit even with full recompute. Static memory does not depend on the schedule, so one
    ``_static_avg`` (``static``, computed here when not given) serves every option."""
    static = _static_avg(table, plan) if static is None else static
    best = None
    for sched, vpp in pipelines:
        name = sched or ("interleaved_1f1b" if vpp > 1 else "1f1b")
        i_max, inv_sum = inflight_stats(name, pp=plan.pp, vpp=vpp, n_micro=plan.n_micro)
        extra = _extra(table, static=static, pp=plan.pp, i_max=i_max, inv_sum=inv_sum, limit=limit,
                       selective=selective)
        if extra is None:
            continue
        factor = pipeline_factor(name if plan.pp > 1 else "", pp=plan.pp, vpp=vpp, n_micro=plan.n_micro,
                                 share=table.share)
        t = factor * (table.work + extra) / plan.pp
        best = t if best is None else min(best, t)
    return best


def dp_exact(table: LayerTable, plan: Plan, *, pool: Pool, calib) -> DPCost | None:
    """Data-parallel cost of a plan without pipelining, as the cost model computes it (``dp_cost`` on the one
    rank that holds every layer); None with pipelining, where it depends on the split."""
    if plan.pp > 1:
        return None
    cal = gpu_calibration(pool.gpu, calib, library=table.stack.kernel_library)
    return dp_cost(table.dense, table.expert, plan=plan, stack=table.stack, links=plan_links(plan, pool), calib=cal,
                   fwd=table.fwd, bwd=table.bwd, n_units=max(sum(b.n_layers for b in table.blocks), 1))
