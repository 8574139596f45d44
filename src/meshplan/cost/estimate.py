"""The estimate: step time and per-GPU memory of (model, cluster, plan), assembled from the pure cost functions.

Step = pipeline time of the per-stage micro-batch costs (closed form, or the event simulator) + exposed
once-per-step data-parallel traffic + optimizer + fixed overhead.
"""

from __future__ import annotations

from dataclasses import replace

from meshplan import catalog
from meshplan.cost.calib import gpu_calibration
from meshplan.cost.comm import collective_time, plan_links
from meshplan.cost.dp import cross_pool_reduce
from meshplan.cost.flops import model_flops
from meshplan.cost.memory import (
    bytes_per_param,
    layer_recompute_mode,
)
from meshplan.cost.pipeline import closed_form
from meshplan.cost.rank_cost import RankCost, rank_cost, rank_of, stages_of
from meshplan.cost.result import Estimate, StageTimes, TimeBreakdown
from meshplan.cost.stage import (
    Ctx,
    LayerCost,
    head_cost,
    layer_cost,
    stage_params,
    tokens_of,
)
from meshplan.errors import PlanError, SpecError
from meshplan.spec.checks import (
    check_plan,
    layer_split,
    replicas_per_pool,
    stack_violations,
)
from meshplan.spec.cluster import ClusterSpec, GroupLink, Pool, derated_pool
from meshplan.spec.framework import FrameworkProfile
from meshplan.spec.model import BlockSpec, ModelSpec
from meshplan.spec.plan import Plan


def stage_layers(model: ModelSpec, plan: Plan) -> list[list[tuple[BlockSpec, int]]]:
    """Layers of each virtual stage, in pipeline order."""
    flat = list(model.layers())
    out, i = [], 0
    for n in layer_split(model, plan):
        out.append(flat[i:i + n])
        i += n
    return out


def rank_pool(cluster: ClusterSpec, plan: Plan, rank: int) -> Pool:
    """The pool that hosts pipeline rank ``rank``: pools are laid out in order over global ranks; a pipeline
    rank that spans several pools (or pp not outermost) runs at the pace of its slowest pool, and of its slowest
    GPU and link where the cluster is derated (``spec.cluster.Derating``)."""
    if cluster.homogeneous:
        return _derated(cluster, plan, rank) if cluster.derating else cluster.pools[0]
    per = plan.n_gpus // plan.pp
    lo, hi = (rank * per, (rank + 1) * per) if plan.rank_order.endswith("pp") else (0, plan.n_gpus)
    spans, start = [], 0
    for p in cluster.pools:
        if start < hi and lo < start + p.n_gpus:
            spans.append(p)
        start += p.n_gpus
    return min(spans, key=lambda p: p.gpu.peak_flops(plan.precision))


def _derated(cluster: ClusterSpec, plan: Plan, rank: int) -> Pool:
    """The pool as pipeline rank ``rank`` sees it: its GPUs are the global ranks whose pp coordinate is ``rank``
    (identity placement); it computes at its slowest GPU's pace and crosses nodes at its slowest link's."""
    pool, der = cluster.pools[0], cluster.derating
    s, dom = plan.stride("pp"), pool.network()[0].span
    mine = lambda g: (g // s) % plan.pp == rank  # noqa: E731
    compute = min((f for g, f in der.gpus if mine(g)), default=1.0)
    link = min((f for d, f in der.links if any(mine(g) for g in range(d * dom, (d + 1) * dom))), default=1.0)
    return derated_pool(pool, compute=compute, link=link)


def _per_layer(model: ModelSpec, plan: Plan, stages: list, ctxs: list[Ctx]) -> list[list[LayerCost]]:
    """Cost of every layer; identical layers (same block, same recompute mode, same rank context) are costed
    once, which keeps the estimate fast enough for search."""
    seen = [0] * plan.pp
    cache: dict[tuple, LayerCost] = {}
    owner = [rank_of(plan, v) for v in range(len(stages))]
    # Layers are counted per rank in its chunk order, so walk each rank's stages in pipeline order.
    order = sorted(range(len(stages)), key=lambda v: (owner[v], v))
    by_stage: dict[int, list[LayerCost]] = {}
    for v in order:
        layers = stages[v]
        r = owner[v]
        row = []
        for block, _ in layers:
            key = (id(block), id(ctxs[r]), layer_recompute_mode(plan, seen[r]))
            if key not in cache:
                cache[key] = layer_cost(block, ctxs[r], index_on_rank=seen[r])
            row.append(cache[key])
            seen[r] += 1
        by_stage[v] = row
    return [by_stage[v] for v in range(len(stages))]


def _stage_times(model: ModelSpec, plan: Plan, costs: list[list[LayerCost]], ctxs: list[Ctx],
                 stages: list) -> StageTimes:
    n = len(costs)
    fwd, bi, bw, p2p, act = [], [], [], [], []
    h_div = plan.tp if plan.sp else 1
    sends: dict[tuple, float] = {}  # one send time per (last block, rank context)
    for v, row in enumerate(costs):
        f = b = w = a = 0.0
        for c in row:
            f += c.forward
            b += c.backward_input
            w += c.bwd_weight
            a += c.act_bytes
        ctx = ctxs[rank_of(plan, v)]
        if v == n - 1:
            hf, hb = head_cost(model, ctx)
            f, b = f + hf, b + hb
        fwd.append(f)
        bi.append(b)
        bw.append(w)
        act.append(a)
        if v == n - 1:
            p2p.append(0.0)
            continue
        block = stages[v][-1][0] if stages[v] else model.blocks[-1]
        key = (id(block), id(ctx))
        if key not in sends:
            nbytes = tokens_of(block, plan) * block.layer.hidden * plan.act_bytes / h_div
            sends[key] = collective_time("send_recv", nbytes, size=2, link=ctx.links.pp, calib=ctx.calib)
        p2p.append(sends[key])
    return StageTimes(fwd=tuple(fwd), bwd_input=tuple(bi), bwd_weight=tuple(bw), p2p=tuple(p2p),
                      act_bytes=tuple(act))


def resolve_stack(plan: Plan, stack: FrameworkProfile | None) -> FrameworkProfile:
    """The profile a plan runs under: ``stack`` when given (a recipe's or a flag's variant of the plan's preset),
    else the catalog preset the plan names; the two must agree on the name."""
    if stack is None:
        return catalog.framework(plan.framework)
    if stack.name != plan.framework:
        raise SpecError("plan.framework", plan.framework, f"the plan names {plan.framework} but is estimated under the "
                        f"{stack.name} profile; set plan.framework = {stack.name!r}")
    return stack


def estimate(model: ModelSpec, cluster: ClusterSpec, plan: Plan, *, stack: FrameworkProfile | None = None,
             calib: dict[str, dict[str, float]] | None = None, pipeline=None) -> Estimate:
    """Predict one optimizer step of ``plan`` for ``model`` on ``cluster`` under its software stack.

    Args:
        stack: the stack's profile; None = the catalog preset ``plan.framework`` names.
        calib: calibration table ``{generation: {constant: value}}``; None = the packaged fitted table.
        pipeline: optional ``f(schedule, times, pp, vpp, n_micro) -> PipelineTime`` (the simulator); None =
            the closed form.
    """
    stack = resolve_stack(plan, stack)
    check_plan(model, cluster, plan)
    bad = stack_violations(plan, stack)
    if bad:
        raise PlanError(bad)
    if plan.batch_shares:
        return _shared_estimate(model, cluster, plan, stack=stack, calib=calib, pipeline=pipeline)
    stages = stage_layers(model, plan)
    ctxs, by_pool = [], {}
    for r in range(plan.pp):
        pool = rank_pool(cluster, plan, r)
        if id(pool) not in by_pool:
            links = plan_links(plan, pool, servers=cluster.server_capacity)
            by_pool[id(pool)] = Ctx(model=model, plan=plan, stack=stack, gpu=pool.gpu, links=links,
                                    calib=gpu_calibration(pool.gpu, calib, library=stack.kernel_library))
        ctxs.append(by_pool[id(pool)])
    costs = _per_layer(model, plan, stages, ctxs)
    times = _stage_times(model, plan, costs, ctxs, stages)
    ranks = [rank_cost(model, plan, r, costs=costs, times=times, stages=stages, ctx=ctxs[r]) for r in range(plan.pp)]
    times = _with_fsdp(times, ranks, plan)
    return _assemble(model, cluster, plan, times=times, ranks=ranks, ctxs=ctxs, pipeline=pipeline)


def _with_fsdp(times: StageTimes, ranks: list[RankCost], plan: Plan) -> StageTimes:
    """Fold per-micro-batch FSDP exposure into the stage durations (spread over a rank's chunks by their
    compute) and record the once-per-step DP tail of each rank."""
    fwd, bi = list(times.fwd), list(times.bwd_input)
    for r, rc in enumerate(ranks):
        idx = stages_of(plan, r)
        tot_f = sum(times.fwd[v] for v in idx) or 1.0
        tot_b = sum(times.bwd_input[v] for v in idx) or 1.0
        for v in idx:
            fwd[v] += rc.dp.per_micro_fwd * times.fwd[v] / tot_f
            bi[v] += rc.dp.per_micro_bwd * times.bwd_input[v] / tot_b
    return StageTimes(fwd=tuple(fwd), bwd_input=tuple(bi), bwd_weight=times.bwd_weight, p2p=times.p2p,
                      act_bytes=times.act_bytes, dp_tail=tuple(rc.dp.per_step for rc in ranks))


def _dp_exposed(times: StageTimes, plan: Plan) -> float:
    """Once-per-step DP exposure on the critical path: rank r's gradient reduction starts when its last
    backward ends, which in 1F1B-style schedules is sum_{q<r} b_q before rank 0's (the drain), so only what
    exceeds that slack extends the step."""
    worst, slack = 0.0, 0.0
    for r, tail in enumerate(times.dp_tail):
        worst = max(worst, tail - slack)
        idx = stages_of(plan, r)
        slack += sum(times.bwd_input[v] + times.bwd_weight[v] for v in idx) / max(plan.vpp, 1)
    return max(worst, 0.0)


def _assemble(model: ModelSpec, cluster: ClusterSpec, plan: Plan, *, times: StageTimes, ranks: list[RankCost],
              ctxs: list[Ctx], pipeline) -> Estimate:
    """Combine stage times, pipeline, DP tail, optimizer and overhead into the Estimate."""
    fn = pipeline or closed_form
    pipe = fn(plan.schedule_name, times, pp=plan.pp, vpp=plan.vpp, n_micro=plan.n_micro)
    m = plan.n_micro
    busiest = max(range(plan.pp), key=lambda r: sum(times.fwd[v] + times.bwd_input[v] + times.bwd_weight[v]
                                                   for v in stages_of(plan, r)))
    rc = ranks[busiest]
    dp_step = _dp_exposed(times, plan)
    fsdp = (rc.dp.per_micro_fwd + rc.dp.per_micro_bwd) * m
    opt = max(r.optimizer for r in ranks)
    overhead = max(c.calib.step_overhead_s for c in ctxs)
    # The busy time splits into its parts; what the pipeline adds beyond busy is bubble and p2p.
    parts = dict(compute=rc.compute * m, tp_comm=rc.tp * m, cp_comm=rc.cp * m, ep_comm=rc.ep * m)
    scale = pipe.busy / max(sum(parts.values()) + fsdp, 1e-30)
    copies = _copy_exposed(plan, ranks, ctxs, busy=pipe.busy)
    tb = TimeBreakdown(compute=parts["compute"] * scale, recompute=rc.recompute * m * scale,
                       host_wait=rc.host_wait * m * scale,
                       tp_comm=parts["tp_comm"] * scale, cp_comm=parts["cp_comm"] * scale,
                       ep_comm=parts["ep_comm"] * scale, dp_comm=fsdp * scale + dp_step + copies, bubble=pipe.bubble,
                       pp_comm=pipe.p2p, optimizer=opt, overhead=overhead)
    step = tb.total()
    flops = model_flops(model, plan)
    peak = sum(p.n_gpus * p.gpu.peak_flops("bf16" if plan.precision == "fp8" else plan.precision)
               for p in cluster.pools)
    mems = tuple(r.memory for r in ranks)
    worst = max(mems, key=lambda mb: mb.total())
    return Estimate(step_time=step, tokens_per_s=plan.global_batch * plan.seq_len / step,
                    mfu=flops / (step * peak), model_flops=flops, time=tb, memory=worst, memory_per_stage=mems,
                    capacity=min(p.gpu.hbm_bytes for p in cluster.pools), stage_times=times,
                    bubble_fraction=pipe.bubble / step, pipeline_source="closed-form" if pipeline is None
                    else "simulator")


def _copy_exposed(plan: Plan, ranks: list[RankCost], ctxs: list[Ctx], *, busy: float) -> float:
    """Exposed time of refreshing the peer copies of optimizer state (``Plan.state_copies``) after a step: each
    rank sends its updated shard to each peer over its NIC, interleaved with the next step in the time its NIC
    is not carrying data-parallel traffic (Gemini's traffic interleaving, Wang et al. SOSP'23 sec. 5) (s)."""
    k = plan.extra_state_copies
    if not k:
        return 0.0
    worst = 0.0
    for rc, ctx in zip(ranks, ctxs):
        send = k * rc.memory.optimizer / (1 + k) / ctx.gpu.nic_bandwidth
        worst = max(worst, send - max(busy - rc.dp.total_traffic, 0.0))
    return max(worst, 0.0)


# -- uneven data-parallel batch shares (only plans with ``batch_shares``) ------------------------------------------
def replica_estimates(model: ModelSpec, cluster: ClusterSpec, plan: Plan, *, stack: FrameworkProfile | None = None,
                      calib: dict[str, dict[str, float]] | None = None, pipeline=None) -> tuple[Estimate, ...]:
    """Each pool's data-parallel replicas estimated as a plan of their own on that pool: dp = its replicas,
    n_micro = its share (HetPipe's virtual workers, Park et al. 2020 sec. 3; Sailor's per-pool replica time)."""
    out = []
    for pool, reps, share in zip(cluster.pools, replicas_per_pool(cluster, plan), plan.batch_shares):
        sub = plan.with_(batch_shares=(), dp=reps, global_batch=reps * share * plan.micro_batch)
        one = ClusterSpec(pools=(pool,), servers=cluster.servers, server_bandwidth=cluster.server_bandwidth)
        out.append(estimate(model, one, sub, stack=stack, calib=calib, pipeline=pipeline))
    return tuple(out)


def cross_pool_time(model: ModelSpec, cluster: ClusterSpec, plan: Plan, *, stack: FrameworkProfile | None = None,
                    calib: dict[str, dict[str, float]] | None = None) -> float:
    """Cross-pool phase of the gradient all-reduce (s), ``meshplan.cost.dp.cross_pool_reduce``: after the in-pool
    reduce-scatter a GPU of pool i holds 1/(replicas_i cp) of its dense gradients and 1/edp_i of its expert
    gradients; the pool with the fewest replicas holds the largest shard. Bandwidth: the cluster's
    inter_pool_bandwidth, else the slower pool's NIC per GPU."""
    if len(cluster.pools) < 2:
        return 0.0
    low = min(replicas_per_pool(cluster, plan))
    _, g_bytes, _ = bytes_per_param(plan, resolve_stack(plan, stack))
    stages = stage_layers(model, plan)
    shard = 0.0
    for r in range(plan.pp):
        idx = stages_of(plan, r)
        layers = [lay for v in idx for lay in stages[v]]
        dense, expert = stage_params(model, layers, plan, first=0 in idx, last=plan.n_stages - 1 in idx)
        edp = plan.with_(dp=low, batch_shares=()).expert_dp
        shard = max(shard, g_bytes * (dense / (low * plan.cp) + expert / edp))
    slow = min(cluster.pools, key=lambda p: p.gpu.nic_bandwidth)
    link = GroupLink(bandwidth=cluster.inter_pool_bandwidth or slow.gpu.nic_bandwidth,
                     latency=max(p.gpu.nic_latency for p in cluster.pools), level="inter_pool")
    cal = gpu_calibration(slow.gpu, calib)  # the cross-pool all-reduce: link constants only
    return cross_pool_reduce(shard, pools=len(cluster.pools), link=link, calib=cal)


def _shared_estimate(model: ModelSpec, cluster: ClusterSpec, plan: Plan, *, stack: FrameworkProfile, calib,
                     pipeline) -> Estimate:
    """Step of a plan with uneven batch shares (HetPipe, Park et al. 2020; Sailor, Strati et al. 2024;
    FlashFlex, Yan et al. 2024): the slowest pool's replica step plus the cross-pool all-reduce. Memory is the
    pool with the highest peak relative to its device memory, and ``capacity`` is that pool's."""
    subs = replica_estimates(model, cluster, plan, stack=stack, calib=calib, pipeline=pipeline)
    slow = max(subs, key=lambda e: e.step_time)
    tb = replace(slow.time, dp_comm=slow.time.dp_comm + cross_pool_time(model, cluster, plan, stack=stack,
                                                                          calib=calib))
    step = tb.total()
    tight, pool = max(zip(subs, cluster.pools), key=lambda ep: ep[0].peak_memory / ep[1].gpu.hbm_bytes)
    flops = model_flops(model, plan)
    peak = sum(p.n_gpus * p.gpu.peak_flops("bf16" if plan.precision == "fp8" else plan.precision)
               for p in cluster.pools)
    return Estimate(step_time=step, tokens_per_s=plan.global_batch * plan.seq_len / step, mfu=flops / (step * peak),
                    model_flops=flops, time=tb, memory=tight.memory, memory_per_stage=tight.memory_per_stage,
                    capacity=pool.gpu.hbm_bytes, stage_times=slow.stage_times,
                    bubble_fraction=slow.time.bubble / step, pipeline_source=slow.pipeline_source)
