"""Builds the partition kernel's problem from per-layer costs: each pipeline rank's speed (its pool), its
in-flight micro-batches under the schedule, its fixed parts (embedding on the first stage, output head and
logits on the last) and its memory limit; turns the kernel's per-rank counts into a virtual-stage split."""

from __future__ import annotations

from meshplan.cost.memory import bytes_per_param, logits_bytes
from meshplan.cost.pipeline import V_SHAPED, inflight_microbatches
from meshplan.search.bounds import LayerTable, expert_shard
from meshplan.search.partition import PartitionProblem, min_max_partition
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import Plan


def _static_per_param(plan: Plan) -> tuple[float, float]:
    """Bytes per dense and per expert parameter after ZeRO sharding (weights + grads + optimizer)."""
    w, g, o = bytes_per_param(plan)
    shard, eshard = plan.zero_group, expert_shard(plan)
    dense = w / (shard if plan.zero >= 3 else 1) + g / (shard if plan.zero >= 2 else 1) + \
        o / (shard if plan.zero >= 1 else 1)
    expert = w / (eshard if plan.zero >= 3 else 1) + g / (eshard if plan.zero >= 2 else 1) + \
        o / (eshard if plan.zero >= 1 else 1)
    if plan.zero == 3 and plan.pp > 1 and plan.n_micro > 1:
        dense, expert = dense + 2.0, expert + 2.0
    return dense, expert


def _spread(rank_layers: tuple[int, ...], plan: Plan) -> tuple[int, ...]:
    """Per-rank counts to layers per virtual stage (looped: chunk * pp + rank; V: rank r holds r, 2pp-1-r)."""
    pp, v = plan.pp, plan.vpp
    out = [0] * (pp * v)
    for r, n in enumerate(rank_layers):
        base, extra = divmod(n, v)
        for c in range(v):
            idx = (pp + (pp - 1 - r)) if (plan.schedule_name in V_SHAPED and c == 1) else c * pp + r
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
    d_b, e_b = _static_per_param(plan)
    for blk in ref.blocks:
        items_t += [blk.work] * blk.n_layers
        items_m += [(blk.dense * d_b + blk.expert * e_b, blk.act[mode])] * blk.n_layers
    stat = sum(s for s, _ in items_m) / len(items_m)
    act = sum(a for _, a in items_m) / len(items_m)
    ref_work = sum(b.work * b.n_layers for b in ref.blocks) or 1.0
    head_rank = 0 if plan.schedule_name in V_SHAPED else pp - 1
    emb_each = ref.emb / (1 if model.tied_embeddings else 2)
    slow, fixed_t, scale, fixed_m = [], [], [], []
    for r in range(pp):
        t = tables[r]
        slow.append(sum(b.work * b.n_layers for b in t.blocks) / ref_work)
        fixed_t.append(t.head if r == head_rank else 0.0)
        inflight = inflight_microbatches(plan.schedule_name, pp=pp, vpp=plan.vpp, n_micro=plan.n_micro, rank=r)
        scale.append((stat + inflight * act) / max(stat + act, 1e-30))
        m = t.reserved + (emb_each * d_b if r == 0 else 0.0)
        if r == pp - 1:
            m += logits_bytes(model, plan) + (emb_each * d_b if not model.tied_embeddings else 0.0)
        fixed_m.append(m)
    prob = PartitionProblem(item_time=tuple(items_t), item_mem=tuple(s + a for s, a in items_m),
                            stage_slowdown=tuple(slow), stage_time=tuple(fixed_t), stage_mem_scale=tuple(scale),
                            stage_mem=tuple(fixed_m), stage_capacity=tuple(limits), min_items=plan.vpp)
    counts = min_max_partition(prob)
    return None if counts is None else _spread(counts, plan)
