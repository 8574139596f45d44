"""Zero-bubble schedules (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"; Qi et al. 2024, "Pipeline
Parallelism with Controllable Memory"). The backward is split into I (input gradient, on the critical path)
and W (weight gradient, deferrable); deferred W passes fill the drain bubble."""

from __future__ import annotations

from collections import deque

from meshplan.errors import SpecError
from meshplan.sim.actions import BACKWARD_INPUT, BACKWARD_WEIGHT, FORWARD, Action
from meshplan.sim.schedule import Schedule, loop_placement, v_placement

F, I, W = FORWARD, BACKWARD_INPUT, BACKWARD_WEIGHT


def zb_h1_row(*, rank: int, pp: int, n_micro: int) -> tuple[Action, ...]:
    """ZB-H1 (Qi et al. 2023, sec. 3.1, fig. 3): 1F1B's warm-up, then F/I pairs; rank r keeps r weight passes
    pending, so the drain of each rank is filled with W work while peak memory stays at rank 0's pp."""
    warm = min(pp - 1 - rank, n_micro)
    row = [Action(F, rank, mb) for mb in range(warm)]
    pending: deque[int] = deque()
    for k in range(n_micro):
        if warm + k < n_micro:
            row.append(Action(F, rank, warm + k))
        row.append(Action(I, rank, k))
        pending.append(k)
        if k >= rank:
            row.append(Action(W, rank, pending.popleft()))
    row += [Action(W, rank, mb) for mb in pending]
    return tuple(row)


def zb_h1(*, pp: int, vpp: int, n_micro: int) -> Schedule:
    """ZB-H1 with one chunk per rank."""
    if vpp != 1:
        raise SpecError("plan.vpp", vpp, "zb_h1 runs one chunk per rank (use zbv for two)")
    rows = tuple(zb_h1_row(rank=r, pp=pp, n_micro=n_micro) for r in range(pp))
    return Schedule(name="zb_h1", pp=pp, n_stages=pp, n_micro=n_micro,
                    placement=loop_placement(pp=pp, n_stages=pp), actions=rows)


def _zbv_row(*, rank: int, pp: int, n_pad: int) -> list[Action]:
    """ZB-V (Qi et al. 2024, sec. 6 / Qi et al. 2023 app.): warm-up on chunk 0, then F/I/W triples on both chunks
    of the V, then I passes with W filling the drain. Built for n_pad >= 2pp-1 micro-batches."""
    s0, s1 = rank, 2 * pp - 1 - rank
    cnt = {(s, k): 0 for s in (s0, s1) for k in (F, I, W)}
    row: list[Action] = []

    def add(kind: str, stage: int) -> None:
        row.append(Action(kind, stage, cnt[stage, kind]))
        cnt[stage, kind] += 1

    for _ in range(2 * (pp - rank) - 1):
        add(F, s0)
    for _ in range(rank):
        add(F, s1), add(F, s0)
    for _ in range(pp - rank):
        add(F, s1), add(I, s1), add(W, s1)
    while cnt[s1, F] < cnt[s0, F] or cnt[s0, F] < n_pad:
        if cnt[s0, F] < n_pad:
            add(F, s0)
        add(I, s0), add(W, s0), add(F, s1), add(I, s1), add(W, s1)
    for _ in range(rank):
        add(I, s0), add(I, s1)
    for _ in range(pp - rank):
        add(I, s0), add(W, s0)
    while cnt[s1, W] < cnt[s1, I]:
        add(W, s1)
    while cnt[s0, W] < cnt[s0, I]:
        add(W, s0)
    return row


def zbv(*, pp: int, vpp: int, n_micro: int) -> Schedule:
    """ZB-V: two chunks per rank in a V (rank r holds stages r and 2pp-1-r). Fewer than 2pp-1 micro-batches
    are handled as torch does: generate for 2pp-1 and drop the actions of the missing micro-batches."""
    if vpp != 2:
        raise SpecError("plan.vpp", vpp, "zbv places exactly two chunks per rank (vpp = 2)")
    n_pad = max(2 * pp - 1, n_micro)
    rows = tuple(tuple(a for a in _zbv_row(rank=r, pp=pp, n_pad=n_pad) if a.microbatch < n_micro)
                 for r in range(pp))
    return Schedule(name="zbv", pp=pp, n_stages=2 * pp, n_micro=n_micro,
                    placement=v_placement(pp=pp, n_stages=2 * pp), actions=rows)


GENERATORS = {"zb_h1": zb_h1, "zbv": zbv}
