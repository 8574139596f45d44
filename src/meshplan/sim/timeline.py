"""The simulator's result: when each action ran on each rank, the step time, per-rank bubble and the peak of
activations in flight."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from meshplan.sim.graph import ActionGraph

KIND_LETTER = "FIWB"


class Span(NamedTuple):
    """One interval on one lane of one rank (s)."""

    rank: int
    lane: str
    """``compute``, ``send->r<k>`` (transfer to rank k) or ``dp`` (gradient reduction after the backward)."""
    name: str
    """E.g. ``F s3 mb7 c1`` (kind, stage, micro-batch, local chunk)."""
    start: float
    end: float
    kind: str = ""
    """``F``, ``I``, ``W``, ``B``, ``SEND_F``, ``SEND_B`` or ``DP``."""
    stage: int = -1
    """Stage of the action (-1 for the dp tail)."""
    microbatch: int = -1
    """Micro-batch of the action (-1 for the dp tail)."""


@dataclass(frozen=True, kw_only=True)
class Timeline:
    """A simulated step. Per-action lists are indexed by the ids of ``graph`` (rank by rank, in order)."""

    graph: ActionGraph
    """The schedule's dependency graph."""
    start: list[float]
    """Compute start per action (s)."""
    end: list[float]
    """Compute end per action (s)."""
    send_start: list[float]
    """Start of the action's outgoing transfer (s), -1 when it sends nothing."""
    send_end: list[float]
    """Arrival of the output at the next rank (s); equals ``end`` when nothing is sent."""
    dp: tuple[tuple[float, float], ...]
    """Per rank: (start, end) of the gradient traffic after its last backward (s)."""
    pipeline_time: float
    """First forward to last backward over all ranks (s)."""
    step_time: float
    """``pipeline_time`` or later, when a rank's gradient traffic ends after it (s)."""
    busy: tuple[float, ...]
    """Compute time per rank (s)."""
    bubble: tuple[float, ...]
    """Idle share of ``pipeline_time`` per rank: 1 - busy / pipeline_time."""
    peak_act_bytes: tuple[float, ...]
    """Peak activation bytes held per rank (F allocates at its start; I frees all but the W share; W and B free)."""
    peak_inflight: tuple[float, ...]
    """The same peak in units of the rank's whole share of one micro-batch (all its chunks)."""

    @property
    def n_events(self) -> int:
        """Simulated events: compute actions plus transfers."""
        return len(self.end) + sum(1 for s in self.send_start if s >= 0.0)

    def spans(self, rank: int) -> list[Span]:
        """Every span of ``rank``: compute, transfers, and the data-parallel tail."""
        g, sched = self.graph, self.graph.schedule
        flat = sched.actions[rank]
        chunk = {s: c for c, s in enumerate(sched.stages_of(rank))}
        out: list[Span] = []
        for step, a in enumerate(flat):
            i = g.offsets[rank] + step
            name = a.label(chunk[a.stage])
            out.append(Span(rank, "compute", name, self.start[i], self.end[i], a.kind, a.stage, a.microbatch))
            if self.send_start[i] >= 0.0:
                kind = "SEND_F" if a.kind == "F" else "SEND_B"
                out.append(Span(rank, f"send->r{g.dst[i]}", kind + name[1:], self.send_start[i], self.send_end[i],
                                kind, a.stage, a.microbatch))
        lo, hi = self.dp[rank]
        if hi > lo:
            out.append(Span(rank, "dp", "DP grad reduce", lo, hi, "DP"))
        return out


def activation_peaks(graph: ActionGraph, act_bytes: tuple[float, ...], *,
                     w_hold: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per rank: peak activation bytes and the peak in units of the rank's share of one micro-batch.

    A forward holds its stage's activations until its backward: B frees them all; I frees all but ``w_hold``
    of them, which W frees (the inputs and output gradients the weight gradient still needs; Qi et al. 2023
    sec. 2 'M_W'). Actions on a rank are sequential, so the rank's order is the order of its memory events.
    """
    sched = graph.schedule
    kind = np.asarray(graph.kind, dtype=np.int8)
    stage = np.asarray(graph.stage, dtype=np.int64)
    sign = np.array([1.0, -(1.0 - w_hold), -w_hold, -1.0])[kind]
    share = np.zeros(sched.pp)
    count = np.zeros(sched.pp)
    act = np.asarray(act_bytes, dtype=float)
    for s, r in enumerate(sched.placement):
        share[r] += act[s]
        count[r] += 1
    place = np.asarray(sched.placement)
    unit = np.where(share[place] > 0, act / np.maximum(share[place], 1e-300), 1.0 / np.maximum(count[place], 1))
    return _peaks(sign * act[stage], graph.offsets), _peaks(sign * unit[stage], graph.offsets)


def _peaks(delta: np.ndarray, offsets: tuple[int, ...]) -> tuple[float, ...]:
    """Max prefix sum of ``delta`` inside each rank's id range (0 for a rank without actions)."""
    out = []
    for lo, hi in zip(offsets[:-1], offsets[1:]):
        out.append(float(max(np.cumsum(delta[lo:hi]).max(), 0.0)) if hi > lo else 0.0)
    return tuple(out)
