"""Builds the partition kernel's problem from per-layer costs: each pipeline rank's speed (its pool), its
in-flight micro-batches under the schedule, its fixed parts (embedding on the first stage, output head and
logits on the last) and its memory limit; turns the kernel's per-rank counts into a virtual-stage split."""

from __future__ import annotations

from meshplan.cost.memory import holds_unsharded, logits_bytes, sharded_state
from meshplan.cost.pipeline import inflight_microbatches
from meshplan.cost.stage import embedding_params
from meshplan.search.bounds import LayerTable
from meshplan.search.partition import PartitionProblem, min_max_partition
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import Plan
from meshplan.spec.schedules import schedule_spec


def _static_per_param(plan: Plan, stack) -> tuple[float, float]:
    """Bytes per dense and per expert parameter after ZeRO sharding (weights + grads + optimizer, and the
    unsharded copy a pipeline keeps), as the cost model counts them."""
    dense = sum(sharded_state(plan, stack, dense=1.0, expert=0.0))
    expert = sum(sharded_state(plan, stack, dense=0.0, expert=1.0))
    if holds_unsharded(plan):
        dense, expert = dense + 2.0, expert + 2.0
    return dense, expert


def _spread(rank_layers: tuple[int, ...], plan: Plan) -> tuple[int, ...]:
    """Per-rank counts to layers per virtual stage (looped: chunk * pp + rank; V: rank r holds r, 2pp-1-r)."""
    pp, v = plan.pp, plan.vpp
    v_shaped = schedule_spec(plan.schedule_name).placement == "v"
    out = [0] * (pp * v)
    for r, n in enumerate(rank_layers):
        base, extra = divmod(n, v)
        for c in range(v):
            idx = (pp + (pp - 1 - r)) if (v_shaped and c == 1) else c * pp + r
            out[idx] = base + (1 if c >= v - extra else 0)
    return tuple(out)


def balanced_split(model: ModelSpec, plan: Plan, *, tables: list[LayerTable],
                   limits: list[float]) -> tuple[int, ...] | None:
    """Layer split that minimizes the slowest pipeline rank under each rank's memory limit, with ranks of
    different speed (``tables[r]`` is rank r's per-layer cost on its pool); None when no split fits.
    Identical layers are weighted by their block; a rank's chunks are then filled as evenly as possible."""
    pp = plan.pp
    ref = tables[0]
    mode = plan.recompute
    items_t, items_m = [], []
    d_b, e_b = _static_per_param(plan, ref.stack)
    for blk in ref.blocks:
        items_t += [blk.work] * blk.n_layers
        items_m += [(blk.dense * d_b + blk.expert * e_b, blk.act[mode])] * blk.n_layers
    stat = sum(s for s, _ in items_m) / len(items_m)
    act = sum(a for _, a in items_m) / len(items_m)
    ref_work = sum(b.work * b.n_layers for b in ref.blocks) or 1.0
    head_rank = schedule_spec(plan.schedule_name).stage_rank(stage=plan.n_stages - 1, pp=pp)
    slow, fixed_t, scale, fixed_m = [], [], [], []
    for r in range(pp):
        t = tables[r]
        slow.append(sum(b.work * b.n_layers for b in t.blocks) / ref_work)
        fixed_t.append(t.head if r == head_rank else 0.0)
        inflight = inflight_microbatches(plan.schedule_name, pp=pp, vpp=plan.vpp, n_micro=plan.n_micro, rank=r)
        scale.append((stat + inflight * act) / max(stat + act, 1e-30))
        # The embedding on rank 0, the output head and its logits on the rank of the last stage.
        m = t.reserved + embedding_params(model, plan, first=r == 0, last=r == head_rank, mtp=False) * d_b
        if r == head_rank:
            m += logits_bytes(model, plan, ref.stack)
        fixed_m.append(m)
    prob = PartitionProblem(item_time=tuple(items_t), item_mem=tuple(s + a for s, a in items_m),
                            stage_slowdown=tuple(slow), stage_time=tuple(fixed_t), stage_mem_scale=tuple(scale),
                            stage_mem=tuple(fixed_m), stage_capacity=tuple(limits), min_items=plan.vpp)
    counts = min_max_partition(prob)
    return None if counts is None else _spread(counts, plan)
