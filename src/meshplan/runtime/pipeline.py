"""Pipeline parallelism with torch.distributed.pipelining: hand-built stages and a registry of schedules.

Stages are built by hand (no tracer): each stage is a ``Decoder`` holding its slice of layers, which is what the
multi-stage, zero-bubble and V-shaped schedules need. The schedule registry (``meshplan.spec.schedules``) names
the torch class and the placement: which stages a pp rank holds (stage r; r, r+pp, ...: interleaved; or r and
2*pp-1-r: ZBV, DualPipeV).
A schedule may also be a user CSV (compute-only actions such as ``0F1``, one row per pp rank), run by
``_PipelineScheduleRuntime``; the stages a rank holds are read from its row.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Callable

import torch
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import _Action, _PipelineScheduleRuntime

from meshplan.errors import SpecError
from meshplan.spec.checks import layer_split
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import Plan
from meshplan.spec.schedules import is_csv, rank_stages, schedule_spec


def schedule_class(name: str) -> type:
    """The torch.distributed.pipelining class of a registered schedule (``ScheduleSpec.torch_class``)."""
    import torch.distributed.pipelining as pipelining

    return getattr(pipelining, schedule_spec(name).torch_class)


def single_stage(name: str) -> bool:
    """torch's class drives one stage per rank (PipelineScheduleSingle: GPipe, 1F1B), else a list of them."""
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

    return issubclass(schedule_class(name), PipelineScheduleSingle)


def csv_stages(path: str) -> dict[int, tuple[int, ...]]:
    """Stage indices each pp rank computes in a compute-only schedule CSV."""
    if not Path(path).is_file():
        raise SpecError("plan.schedule", path, "schedule CSV not found")
    out = {}
    with open(path, newline="") as f:
        for rank, row in enumerate(csv.reader(f)):
            acts = [_Action.from_str(cell) for cell in row if cell.strip()]
            out[rank] = tuple(sorted({a.stage_index for a in acts if a is not None}))
    return out


def pipeline_violations(plan: Plan) -> list[str]:
    """Schedule problems of a plan, as sentences (empty when pp == 1)."""
    if plan.pp == 1:
        return []
    name = plan.schedule_name
    if is_csv(name):
        if not Path(name).is_file():
            return [f"schedule CSV {name} not found"]
        rows = csv_stages(name)
        if len(rows) != plan.pp:
            return [f"schedule CSV {name} has {len(rows)} rows, pp={plan.pp}"]
        return []
    for n_micro in sorted(set(plan.batch_shares or (plan.n_micro,))):  # every replica's own schedule
        why = schedule_spec(name).accepts(pp=plan.pp, vpp=plan.vpp, n_micro=n_micro)
        if why:
            return [why]
        # torch.distributed.pipelining refuses fewer micro-batches than stages for every schedule but GPipe's.
        if n_micro < plan.pp and name != "gpipe":
            return [f"schedule {name} needs at least pp={plan.pp} micro-batches in torch.distributed.pipelining, "
                    f"plan has {n_micro}" + (" on a replica" if plan.batch_shares else "")]
    return []


def stages_of_rank(plan: Plan, pp_rank: int) -> tuple[int, ...]:
    """Global stage indices held by pipeline rank ``pp_rank``."""
    if is_csv(plan.schedule_name):
        return csv_stages(plan.schedule_name)[pp_rank]
    return rank_stages(plan.schedule_name, pp=plan.pp, n_stages=plan.n_stages)[pp_rank]


def stage_layers(spec: ModelSpec, plan: Plan, stage: int) -> tuple[int, ...]:
    """Global layer indices of one stage (layer_split is in pipeline order)."""
    split = layer_split(spec, plan)
    lo = sum(split[:stage])
    return tuple(range(lo, lo + split[stage]))


def build_schedule(*, plan: Plan, parts: list[torch.nn.Module], stage_ids: tuple[int, ...],
                   device: torch.device, group, loss_fn: Callable, n_micro: int, scale_grads: bool = True):
    """PipelineStages for this rank's parts, and the plan's schedule driving them over ``n_micro`` micro-batches
    (the replica's share); ``scale_grads``: torch's 1/n_micro on the gradients after the last backward."""
    n_stages = plan.n_stages
    stages = [PipelineStage(part, s, n_stages, device, group=group) for part, s in zip(parts, stage_ids)]
    name = plan.schedule_name
    if is_csv(name):
        sched = _PipelineScheduleRuntime(stages, n_microbatches=n_micro, loss_fn=loss_fn, scale_grads=scale_grads)
        sched._load_csv(name)
        return sched
    cls = schedule_class(name)
    if single_stage(name):
        return cls(stages[0], n_microbatches=n_micro, loss_fn=loss_fn, scale_grads=scale_grads)
    return cls(stages, n_microbatches=n_micro, loss_fn=loss_fn, scale_grads=scale_grads)
