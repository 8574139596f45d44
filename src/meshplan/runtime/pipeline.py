"""Pipeline parallelism with torch.distributed.pipelining: hand-built stages and a registry of schedules.

Stages are built by hand (no tracer): each stage is a ``Decoder`` holding its slice of layers, which is what the
multi-stage, zero-bubble and V-shaped schedules need. A schedule's *style* says which stages a pp rank holds:
``single`` (stage r), ``loop`` (stages r, r+pp, ...: interleaved) or ``v`` (stages r and 2*pp-1-r: ZBV, DualPipeV).
A schedule may also be a user CSV (compute-only actions such as ``0F1``, one row per pp rank), run by
``_PipelineScheduleRuntime``; the stages a rank holds are read from its row.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleDualPipeV, ScheduleGPipe,
                                          ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble,
                                          ScheduleLoopedBFS, ScheduleZBVZeroBubble)
from torch.distributed.pipelining.schedules import _Action, _PipelineScheduleRuntime

from meshplan.errors import SpecError
from meshplan.spec.checks import layer_split
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import Plan


@dataclass(frozen=True, kw_only=True)
class ScheduleKind:
    """A registered schedule: the torch class and how stages map to ranks."""

    cls: type
    """torch.distributed.pipelining schedule class."""
    style: str
    """``single``, ``loop`` or ``v``."""


def schedule_registry() -> dict[str, ScheduleKind]:
    """Every schedule name the runtime accepts (plan.schedule), mapped to torch's implementation."""
    return {
        "gpipe": ScheduleKind(cls=ScheduleGPipe, style="single"),
        "1f1b": ScheduleKind(cls=Schedule1F1B, style="single"),
        "interleaved_1f1b": ScheduleKind(cls=ScheduleInterleaved1F1B, style="loop"),
        "looped_bfs": ScheduleKind(cls=ScheduleLoopedBFS, style="loop"),
        "interleaved_zb": ScheduleKind(cls=ScheduleInterleavedZeroBubble, style="loop"),
        "zb_h1": ScheduleKind(cls=ScheduleInterleavedZeroBubble, style="loop"),  # the simulator's name
        "zbv": ScheduleKind(cls=ScheduleZBVZeroBubble, style="v"),
        "dualpipev": ScheduleKind(cls=ScheduleDualPipeV, style="v"),
    }


def is_csv(schedule: str) -> bool:
    """A plan's schedule names a CSV file rather than a registered schedule."""
    return schedule.endswith(".csv")


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
    reg = schedule_registry()
    if name not in reg:
        return [f"schedule {name!r} is not registered; known: {', '.join(reg)} or a .csv file"]
    style = reg[name].style
    if style == "single" and plan.vpp != 1:
        return [f"schedule {name} runs one stage per rank, plan has vpp={plan.vpp}"]
    if style == "v" and plan.vpp != 2:
        return [f"schedule {name} is V-shaped and needs vpp=2, plan has vpp={plan.vpp}"]
    if plan.n_micro < plan.pp and name != "gpipe":
        return [f"schedule {name} needs at least pp={plan.pp} micro-batches, plan has {plan.n_micro}"]
    return []


def stages_of_rank(plan: Plan, pp_rank: int) -> tuple[int, ...]:
    """Global stage indices held by pipeline rank ``pp_rank``."""
    if is_csv(plan.schedule_name):
        return csv_stages(plan.schedule_name)[pp_rank]
    style = schedule_registry()[plan.schedule_name].style
    if style == "v":
        return (pp_rank, 2 * plan.pp - 1 - pp_rank)
    return tuple(pp_rank + c * plan.pp for c in range(plan.vpp))


def stage_layers(spec: ModelSpec, plan: Plan, stage: int) -> tuple[int, ...]:
    """Global layer indices of one stage (layer_split is in pipeline order)."""
    split = layer_split(spec, plan)
    lo = sum(split[:stage])
    return tuple(range(lo, lo + split[stage]))


def build_schedule(*, plan: Plan, parts: list[torch.nn.Module], stage_ids: tuple[int, ...],
                   device: torch.device, group, loss_fn: Callable):
    """PipelineStages for this rank's parts, and the plan's schedule driving them."""
    n_stages = plan.n_stages
    stages = [PipelineStage(part, s, n_stages, device, group=group) for part, s in zip(parts, stage_ids)]
    name = plan.schedule_name
    if is_csv(name):
        sched = _PipelineScheduleRuntime(stages, n_microbatches=plan.n_micro, loss_fn=loss_fn)
        sched._load_csv(name)
        return sched
    kind = schedule_registry()[name]
    if kind.style == "single":
        return kind.cls(stages[0], n_microbatches=plan.n_micro, loss_fn=loss_fn)
    return kind.cls(stages, n_microbatches=plan.n_micro, loss_fn=loss_fn)
