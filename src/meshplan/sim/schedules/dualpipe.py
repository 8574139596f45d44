"""DualPipeV (DeepSeek-AI 2024, DeepSeek-V3 report sec. 3.2.1; the "cut-in-half" V variant of DualPipe from
deepseek-ai/DualPipe): two chunks per rank in a V, micro-batches fed from one end, forward and backward of
different chunks paired so that one's communication can hide behind the other's compute.

The paired "overlapped F&B" is written as its F followed by its B (torch's OVERLAP_F_B runs its sub-actions in
that order too); the simulator therefore gives no overlap credit beyond what ``StageTimes`` already holds.
"""

from __future__ import annotations

from collections import deque

from meshplan.errors import SpecError
from meshplan.sim.actions import (
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    FULL_BACKWARD,
    Action,
)
from meshplan.sim.schedule import Schedule, v_placement


class _Row:
    """Builder of one rank's actions with per-(stage, kind) micro-batch counters and a queue of deferred W."""

    def __init__(self, s0: int, s1: int):
        self.s0, self.s1 = s0, s1
        self.fwd = {s0: 0, s1: 0}
        self.bwd = {s0: 0, s1: 0}
        self.pending: deque[tuple[int, int]] = deque()
        self.actions: list[Action] = []

    def f(self, stage: int) -> None:
        self.actions.append(Action(FORWARD, stage, self.fwd[stage]))
        self.fwd[stage] += 1

    def b(self, stage: int, *, split: bool) -> None:
        """Backward of the next micro-batch: fused B, or I with its W queued."""
        mb = self.bwd[stage]
        self.bwd[stage] += 1
        self.actions.append(Action(BACKWARD_INPUT if split else FULL_BACKWARD, stage, mb))
        if split:
            self.pending.append((stage, mb))

    def w(self) -> None:
        """The oldest deferred weight pass, if any."""
        if self.pending:
            stage, mb = self.pending.popleft()
            self.actions.append(Action(BACKWARD_WEIGHT, stage, mb))


def dualpipev_row(*, rank: int, pp: int, n_micro: int) -> tuple[Action, ...]:
    """The eight phases of DualPipeV for one rank (deepseek-ai/DualPipe ``dualpipev.py``): chunk-0 warm-up,
    paired warm-up, I/W/F on chunk 1, overlapped F&B steady state, drain with the backward split into I/W on
    the second half so deferred W fill the tail."""
    s0, s1 = rank, 2 * pp - 1 - rank
    row = _Row(s0, s1)
    for _ in range(2 * (pp - rank - 1)):
        row.f(s0)
    for _ in range(rank + 1):
        row.f(s0), row.f(s1)
    for _ in range(pp - rank - 1):
        row.b(s1, split=True), row.w(), row.f(s1)
    for i in range(n_micro - 2 * pp + rank + 1):
        row.f(s0), row.b(s1, split=False)  # overlapped F&B pair
        row.f(s1), row.b(s0, split=False)
    for _ in range(pp - rank - 1):
        row.b(s1, split=False)
        row.f(s1), row.b(s0, split=False)
    split = False
    for i in range(rank + 1):
        split = split or (i == (rank + 1) // 2 and rank % 2 == 1)
        row.b(s1, split=split)
        split = split or (i == (rank + 1) // 2 and rank % 2 == 0)
        row.b(s0, split=split)
    for _ in range(pp - rank - 1):
        row.w(), row.b(s0, split=split)
    for _ in range(rank + 1):
        row.w()
    return tuple(row.actions)


def dualpipev(*, pp: int, vpp: int, n_micro: int) -> Schedule:
    """DualPipeV: rank r holds stages r and 2pp-1-r; needs at least 2pp micro-batches."""
    if vpp != 2:
        raise SpecError("plan.vpp", vpp, "dualpipev places exactly two chunks per rank (vpp = 2)")
    if n_micro < 2 * pp:
        raise SpecError("n_micro", n_micro, f"dualpipev needs at least 2*pp = {2 * pp} micro-batches")
    rows = tuple(dualpipev_row(rank=r, pp=pp, n_micro=n_micro) for r in range(pp))
    return Schedule(name="dualpipev", pp=pp, n_stages=2 * pp, n_micro=n_micro,
                    placement=v_placement(pp=pp, n_stages=2 * pp), actions=rows)


GENERATORS = {"dualpipev": dualpipev}
