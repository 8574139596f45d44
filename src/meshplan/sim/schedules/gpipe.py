"""GPipe (Huang et al. 2019): all forwards, then all backwards. With several chunks per rank it is torch's
LoopedBFS: chunk by chunk, breadth first. Holds every micro-batch's activations at once."""

from __future__ import annotations

from meshplan.sim.actions import FORWARD, FULL_BACKWARD, Action
from meshplan.sim.schedule import Schedule, loop_placement


def gpipe(*, pp: int, vpp: int, n_micro: int) -> Schedule:
    """Rank r runs F of every micro-batch on each of its chunks (first chunk first), then B in reverse chunk
    order, micro-batches in order (as torch's ScheduleGPipe / ScheduleLoopedBFS)."""
    rows = []
    for r in range(pp):
        stages = [c * pp + r for c in range(vpp)]
        row = [Action(FORWARD, s, mb) for s in stages for mb in range(n_micro)]
        row += [Action(FULL_BACKWARD, s, mb) for s in reversed(stages) for mb in range(n_micro)]
        rows.append(tuple(row))
    return Schedule(name="gpipe" if vpp == 1 else "looped_bfs", pp=pp, n_stages=pp * vpp, n_micro=n_micro,
                    placement=loop_placement(pp=pp, n_stages=pp * vpp), actions=tuple(rows))


GENERATORS = {"gpipe": gpipe, "looped_bfs": gpipe}
"""GPipe on one chunk per rank; on several it is torch's LoopedBFS."""
