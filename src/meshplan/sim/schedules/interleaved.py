"""Interleaved 1F1B (Narayanan et al. 2021, sec. 2.2.2): v chunks per rank, stage ``chunk * pp + rank``,
micro-batches taken in rounds so the fill and drain shrink by v at the cost of more activations in flight."""

from __future__ import annotations

from meshplan.errors import SpecError
from meshplan.sim.actions import FORWARD, FULL_BACKWARD, Action
from meshplan.sim.schedule import Schedule, loop_placement
from meshplan.sim.schedules.one_f_one_b import one_f_one_b


def rounds(*, pp: int, n_micro: int) -> int:
    """Micro-batches per round: the flexible rule of torch's ScheduleInterleaved1F1B (rounds = max(1, m // pp),
    m divisible by the number of rounds), which is Megatron's groups of pp when pp divides m."""
    n_rounds = max(1, n_micro // pp)
    if n_micro % n_rounds:
        raise SpecError("n_micro", n_micro, f"interleaved schedules need m divisible by max(1, m // pp) = {n_rounds}")
    return n_micro // n_rounds


def _order(k: int, *, per_round: int, vpp: int, backward: bool) -> tuple[int, int]:
    """(chunk, micro-batch) of the k-th forward (or backward) of a rank."""
    chunk = (k // per_round) % vpp
    mb = (k // (per_round * vpp)) * per_round + k % per_round
    return (vpp - 1 - chunk if backward else chunk), mb


def interleaved_row(*, rank: int, pp: int, vpp: int, n_micro: int, per_round: int) -> tuple[Action, ...]:
    """One rank: (v-1)*round + 2(pp-1-rank) warm-up forwards (Megatron's count), F/B pairs, cool-down."""
    total = vpp * n_micro
    warm = min((vpp - 1) * per_round + 2 * (pp - 1 - rank), total)

    def act(kind: str, k: int) -> Action:
        chunk, mb = _order(k, per_round=per_round, vpp=vpp, backward=kind != FORWARD)
        return Action(kind, chunk * pp + rank, mb)

    row = [act(FORWARD, k) for k in range(warm)]
    for j in range(total - warm):
        row.append(act(FORWARD, warm + j))
        row.append(act(FULL_BACKWARD, j))
    row += [act(FULL_BACKWARD, k) for k in range(total - warm, total)]
    return tuple(row)


def interleaved_1f1b(*, pp: int, vpp: int, n_micro: int) -> Schedule:
    """Interleaved 1F1B; with vpp == 1 it is plain 1F1B."""
    if vpp == 1:
        return one_f_one_b(pp=pp, vpp=1, n_micro=n_micro)
    per_round = rounds(pp=pp, n_micro=n_micro)
    rows = tuple(interleaved_row(rank=r, pp=pp, vpp=vpp, n_micro=n_micro, per_round=per_round)
                 for r in range(pp))
    return Schedule(name="interleaved_1f1b", pp=pp, n_stages=pp * vpp, n_micro=n_micro,
                    placement=loop_placement(pp=pp, n_stages=pp * vpp), actions=rows)


GENERATORS = {"interleaved_1f1b": interleaved_1f1b}
