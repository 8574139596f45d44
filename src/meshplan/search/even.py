"""Bounds under the even layer split: per-rank work when layers are spread evenly over the virtual stages,
and the pipeline-plus-DP-tail lower bound the driver uses before partitioning a leaf's layers."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

from meshplan.cost.calib import gpu_calibration
from meshplan.cost.comm import plan_links
from meshplan.cost.dp import dp_cost
from meshplan.cost.pipeline import stage_rank
from meshplan.cost.stage import embedding_params
from meshplan.search.bounds import LayerTable
from meshplan.spec.cluster import Pool
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import Plan
from meshplan.spec.schedules import rank_stages, schedule_spec


@dataclass(frozen=True, kw_only=True)
class EvenSplit:
    """Per-rank sums under the even layer split (``meshplan.spec.checks.even_split``)."""

    work: tuple[float, ...]
    """Work per micro-batch of each pipeline rank, head included (s)."""
    first: tuple[float, float, float, float, int]
    """Rank 0: (dense params, expert params, forward s, backward s, layers), the head included where rank 0
    holds the last stage."""


def even_split_work(model: ModelSpec, table: LayerTable, plan: Plan) -> EvenSplit:
    """Work of each pipeline rank when layers are split evenly over the virtual stages, the head on the rank
    that holds the last stage (looped placement, or rank 0 for V-shaped schedules)."""
    from meshplan.spec.checks import even_split

    split = even_split(model.n_layers, plan.n_stages)
    cw, cd, ce, cf = (table.prefix[k] for k in ("work", "dense", "expert", "fwd"))  # a stage's sum: a difference
    ranks = rank_stages(plan.schedule_name, pp=plan.pp, n_stages=plan.n_stages)
    bounds = list(accumulate(split, initial=0))
    work = [sum(cw[bounds[v + 1]] - cw[bounds[v]] for v in stages) for stages in ranks]
    d = e = f = bw = 0.0
    for v in ranks[0]:
        lo, hi = bounds[v], bounds[v + 1]
        d, e = d + cd[hi] - cd[lo], e + ce[hi] - ce[lo]
        f += cf[hi] - cf[lo]
        bw += (cw[hi] - cw[lo]) - (cf[hi] - cf[lo])
    n0 = sum(split[v] for v in ranks[0])
    head_rank = stage_rank(plan.schedule_name, stage=plan.n_stages - 1, pp=plan.pp)
    work[head_rank] += table.head
    v_shaped = head_rank == 0 and plan.pp > 1
    emb = embedding_params(model, plan, first=True, last=v_shaped, mtp=False)
    if v_shaped:
        # V-shaped: rank 0 also holds the output head (its own weights unless tied) and its compute, which hides
        # data-parallel traffic; crediting the whole head to both passes keeps the tail a lower bound.
        f, bw = f + table.head, bw + table.head
    return EvenSplit(work=tuple(work), first=(d + emb, e, f, bw, n0))


def even_pipeline_bound(split: EvenSplit, table: LayerTable, plan: Plan, *, pool: Pool, calib) -> float:
    """Lower bound of the even split's step without its optimizer and overhead (s): the closed forms before
    max_r W_r is relaxed to the average (see ``pipeline_factor``), plus rank 0's once-per-step data-parallel
    tail, which nothing hides (``meshplan.cost.estimate._dp_exposed`` gives rank 0 no slack)."""
    m = plan.n_micro
    wmax, total = max(split.work), sum(split.work)
    c, e = schedule_spec(plan.schedule_name).fill_coefficient(plan.pp, plan.vpp, m, table.share)
    pipe = (m + e) * wmax + c * (total - wmax)
    if plan.zero == 3 and m == 1:
        return pipe
    cal = gpu_calibration(pool.gpu, calib, library=table.stack.kernel_library)
    dense, expert, f, b, n0 = split.first
    tail = dp_cost(dense, expert, plan=plan, stack=table.stack, links=plan_links(plan, pool), calib=cal, fwd=f,
                   bwd=b, n_units=max(n0, 1)).per_step
    return pipe + tail
