"""The dependency graph of a schedule, flattened into integer lists for the simulator's sweep.

Every action except the first stage's forwards has exactly one dependency (Narayanan et al. 2021, fig. 3-4):
F(s, mb) needs F(s-1, mb); I or B(s, mb) needs the input gradient of I or B(s+1, mb), or, on the last stage,
F(s, mb); W(s, mb) needs I(s, mb). Same-rank order is the rank's action order, so a dependency that sits later
on the same rank is a deadlock the sweep reports.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.sim.actions import (
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    FULL_BACKWARD,
    Action,
)
from meshplan.sim.schedule import Schedule, ScheduleError

KIND_CODE = {FORWARD: 0, BACKWARD_INPUT: 1, BACKWARD_WEIGHT: 2, FULL_BACKWARD: 3}


@dataclass(frozen=True, kw_only=True)
class ActionGraph:
    """Actions numbered rank by rank in execution order: rank r owns ids ``offsets[r] .. offsets[r+1]-1``."""

    schedule: Schedule
    """The schedule the graph was built from."""
    offsets: tuple[int, ...]
    """pp + 1 entries; the id range of each rank."""
    kind: list[int]
    """Kind code per action (0 F, 1 I, 2 W, 3 B)."""
    stage: list[int]
    """Stage per action."""
    dep: list[int]
    """Id of the action this one waits for, or -1."""
    remote: list[bool]
    """Whether the dependency's output crosses ranks (then the transfer time applies)."""
    dst: list[int]
    """Rank this action's output is sent to, or -1 (no transfer)."""
    hop: list[int]
    """Index into ``StageTimes.p2p`` of the transfer (the link between stages hop and hop+1), or -1."""

    def rank_of(self, action_id: int) -> tuple[int, int]:
        """(rank, step) of an action id."""
        for r in range(len(self.offsets) - 1):
            if action_id < self.offsets[r + 1]:
                return r, action_id - self.offsets[r]
        raise IndexError(action_id)


def _index(sched: Schedule) -> tuple[list[int], list[Action]]:
    """Dense position table ``pos[(kind*S + stage)*M + mb] -> id``; rejects foreign stages and duplicates."""
    s_n, m_n = sched.n_stages, sched.n_micro
    pos = [-1] * (4 * s_n * m_n)
    flat: list[Action] = []
    for r, row in enumerate(sched.actions):
        for step, a in enumerate(row):
            if a.kind not in KIND_CODE:
                raise ScheduleError(f"is not a compute action ({'/'.join(KIND_CODE)})", rank=r, step=step,
                                    action=str(a), source=sched.name)
            if not (0 <= a.stage < s_n and 0 <= a.microbatch < m_n):
                raise ScheduleError(f"outside {s_n} stages x {m_n} micro-batches", rank=r, step=step,
                                    action=str(a), source=sched.name)
            if sched.placement[a.stage] != r:
                raise ScheduleError(f"stage {a.stage} belongs to rank {sched.placement[a.stage]}", rank=r,
                                    step=step, action=str(a), source=sched.name)
            key = (KIND_CODE[a.kind] * s_n + a.stage) * m_n + a.microbatch
            if pos[key] >= 0:
                fr, fs = _locate(sched, pos[key])
                raise ScheduleError(f"appears twice (first at rank {fr}, step {fs})", rank=r, step=step,
                                    action=str(a), source=sched.name)
            pos[key] = len(flat)
            flat.append(a)
    return pos, flat


def _locate(sched: Schedule, action_id: int) -> tuple[int, int]:
    for r, row in enumerate(sched.actions):
        if action_id < len(row):
            return r, action_id
        action_id -= len(row)
    raise IndexError(action_id)


def _missing(sched: Schedule, pos: list[int]) -> ScheduleError | None:
    """The first (stage, micro-batch) without its forward, or without exactly one backward (B, or I and W)."""
    s_n, m_n = sched.n_stages, sched.n_micro
    for s in range(s_n):
        for mb in range(m_n):
            f, i, w, b = (pos[(k * s_n + s) * m_n + mb] >= 0 for k in range(4))
            want = None
            if not f:
                want = Action(FORWARD, s, mb)
            elif b and (i or w):
                return ScheduleError(f"{s}B{mb} and {s}{'I' if i else 'W'}{mb} both present; a backward is either B "
                                     "or I + W", rank=sched.placement[s], action=f"{s}B{mb}", source=sched.name)
            elif not b and not i:
                want = Action(FULL_BACKWARD, s, mb)
            elif i != w:
                want = Action(BACKWARD_WEIGHT if i else BACKWARD_INPUT, s, mb)
            if want is not None:
                return ScheduleError(f"missing (no rank runs it; stage {s} lives on rank {sched.placement[s]})",
                                     rank=sched.placement[s], action=str(want), source=sched.name)
    return None


def build_graph(sched: Schedule) -> ActionGraph:
    """Number the actions, check that each is present once, and find each one's dependency."""
    pos, flat = _index(sched)
    s_n, m_n, place = sched.n_stages, sched.n_micro, sched.placement
    sm = s_n * m_n
    n_f, n_i, n_w, n_b = (sm - pos[k * sm:(k + 1) * sm].count(-1) for k in range(4))
    if n_f != sm or n_i != n_w or n_i + n_b != sm:
        raise _missing(sched, pos) or ScheduleError("action counts do not add up", source=sched.name)
    n = len(flat)
    kind, stage, dep = [0] * n, [0] * n, [-1] * n
    remote, dst, hop = [False] * n, [-1] * n, [-1] * n
    for a_id, a in enumerate(flat):
        k, s, mb = KIND_CODE[a.kind], a.stage, a.microbatch
        kind[a_id], stage[a_id] = k, s
        if k == 0:
            d = pos[(s - 1) * m_n + mb] if s > 0 else -1
            if s + 1 < s_n and place[s + 1] != place[s]:
                dst[a_id], hop[a_id] = place[s + 1], s
        elif k == 2:
            d = pos[(s_n + s) * m_n + mb]
        else:
            if k == 3 and pos[(s_n + s) * m_n + mb] >= 0:
                raise _missing(sched, pos) or ScheduleError("B and I both present", action=str(a), source=sched.name)
            if s == s_n - 1:
                d = pos[s * m_n + mb]
            else:
                d = pos[(s_n + s + 1) * m_n + mb]
                d = d if d >= 0 else pos[(3 * s_n + s + 1) * m_n + mb]
            if s > 0 and place[s - 1] != place[s]:
                dst[a_id], hop[a_id] = place[s - 1], s - 1
        if d < 0 and not (k == 0 and s == 0):
            raise _missing(sched, pos) or ScheduleError("has no producer", action=str(a), source=sched.name)
        dep[a_id] = d
        remote[a_id] = d >= 0 and place[flat[d].stage] != place[s]
    offsets = [0]
    for row in sched.actions:
        offsets.append(offsets[-1] + len(row))
    return ActionGraph(schedule=sched, offsets=tuple(offsets), kind=kind, stage=stage, dep=dep, remote=remote,
                       dst=dst, hop=hop)
