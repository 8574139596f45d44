"""Pipeline schedules as per-rank action lists, and the event simulator that is the ground truth for pipeline
time and in-flight activations.

Public API (what ``meshplan estimate`` and the search use)::

    schedule_names() -> list[str]
    get_schedule(name, *, pp, vpp, n_micro) -> Schedule
    load_schedule_csv(path) -> Schedule                # torch.distributed.pipelining / torchtitan CSV
    write_schedule_csv(schedule, path) -> None
    validate(schedule) -> None                         # raises ScheduleError(rank, step, action)
    simulate(schedule_or_name, times: StageTimes, *, pp=0, vpp=1, n_micro=0, w_hold=0.5) -> Timeline

Stage times (``meshplan.cost.result.StageTimes``) are indexed by stage in pipeline order; each schedule's
``placement`` says which rank holds a stage (``chunk * pp + rank`` for looped schedules, rank r holding stages
r and 2pp-1-r for the V-shaped ``zbv`` and ``dualpipev``). To simulate one schedule under many stage times
(search), build its graph once: ``simulate_graph(build_graph(schedule), times)``.
"""

from __future__ import annotations

from meshplan.sim.actions import Action
from meshplan.sim.engine import simulate, simulate_graph
from meshplan.sim.graph import build_graph
from meshplan.sim.schedule import Schedule, ScheduleError
from meshplan.sim.schedules import get_schedule, schedule_names
from meshplan.sim.schedules.csv_io import load_schedule_csv, write_schedule_csv
from meshplan.sim.timeline import Span, Timeline
from meshplan.sim.validate import validate

__all__ = ["Action", "Schedule", "ScheduleError", "Span", "Timeline", "build_graph", "get_schedule",
           "load_schedule_csv", "schedule_names", "simulate", "simulate_graph", "validate", "write_schedule_csv"]
