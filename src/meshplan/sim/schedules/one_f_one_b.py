"""1F1B / PipeDream-Flush (Narayanan et al. 2021, sec. 2.2.1): a short warm-up of forwards, then one forward
and one backward alternately, so rank r never holds more than pp - r micro-batches."""

from __future__ import annotations

from meshplan.errors import SpecError
from meshplan.sim.actions import FORWARD, FULL_BACKWARD, Action
from meshplan.sim.schedule import Schedule, loop_placement


def one_f_one_b_row(*, rank: int, pp: int, n_micro: int, stage: int) -> tuple[Action, ...]:
    """Actions of one rank: min(pp-1-rank, m) warm-up forwards, steady F/B pairs, cool-down backwards."""
    warm = min(pp - 1 - rank, n_micro)
    row = [Action(FORWARD, stage, mb) for mb in range(warm)]
    for j in range(n_micro - warm):
        row.append(Action(FORWARD, stage, warm + j))
        row.append(Action(FULL_BACKWARD, stage, j))
    row += [Action(FULL_BACKWARD, stage, mb) for mb in range(n_micro - warm, n_micro)]
    return tuple(row)


def one_f_one_b(*, pp: int, vpp: int, n_micro: int) -> Schedule:
    """1F1B with one chunk per rank. ``vpp > 1`` is served by ``interleaved_1f1b``."""
    if vpp != 1:
        raise SpecError("plan.vpp", vpp, "1f1b runs one chunk per rank; use interleaved_1f1b for vpp > 1")
    rows = tuple(one_f_one_b_row(rank=r, pp=pp, n_micro=n_micro, stage=r) for r in range(pp))
    return Schedule(name="1f1b", pp=pp, n_stages=pp, n_micro=n_micro,
                    placement=loop_placement(pp=pp, n_stages=pp), actions=rows)


GENERATORS = {"1f1b": one_f_one_b}
