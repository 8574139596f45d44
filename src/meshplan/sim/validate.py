"""Validation of a schedule before use: every action present once on the rank that holds its stage, every
dependency produced, and no deadlock (a zero-duration simulation must place every action)."""

from __future__ import annotations

from meshplan.sim.engine import sweep
from meshplan.sim.graph import build_graph
from meshplan.sim.schedule import Schedule


def validate(schedule: Schedule) -> None:
    """Return None for a runnable schedule.

    Raises:
        ScheduleError: naming the rank, step and action at fault (duplicate, missing, foreign stage, deadlock).
    """
    graph = build_graph(schedule)
    n = len(graph.kind)
    sweep(graph, [0.0] * n, [0.0] * n)
