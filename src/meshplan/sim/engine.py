"""Event simulation of a pipeline schedule: each rank runs its actions in order on one compute stream; an
action starts when the stream is free and its dependency has arrived; outputs that cross ranks travel on the
directed link (sender rank -> receiver rank), one transfer at a time per link, in the sender's order.

Because every rank is in-order and every action has at most one dependency, no event queue is needed: a sweep
advances each rank as far as its dependencies allow, alternating direction (forwards flow to higher stages,
gradients to lower ones), until every action is placed. A sweep that places nothing is a deadlock.
"""

from __future__ import annotations

from meshplan.cost.result import StageTimes
from meshplan.sim.graph import ActionGraph, build_graph
from meshplan.sim.schedule import Schedule, ScheduleError
from meshplan.sim.schedules import get_schedule
from meshplan.sim.timeline import Timeline, activation_peaks


def durations(graph: ActionGraph, times: StageTimes) -> tuple[list[float], list[float]]:
    """Per action: compute duration (s) and outgoing transfer duration (s, 0 when nothing is sent)."""
    n_st = graph.schedule.n_stages
    if times.n_stages != n_st or len(times.p2p) < n_st - 1:
        raise ScheduleError(f"stage times cover {times.n_stages} stages, the schedule has {n_st}",
                            source=graph.schedule.name)
    table = (times.fwd, times.bwd_input, times.bwd_weight,
             tuple(i + w for i, w in zip(times.bwd_input, times.bwd_weight)))
    dur = [table[k][s] for k, s in zip(graph.kind, graph.stage)]
    p2p = times.p2p
    xfer = [p2p[h] if h >= 0 else 0.0 for h in graph.hop]
    return dur, xfer


def sweep(graph: ActionGraph, dur: list[float], xfer: list[float]) -> tuple[list[float], list[float], list[float]]:
    """Place every action in time. Returns per action: end of compute, start of its outgoing transfer (-1 if
    none), and arrival of its output at the consumer (= end when nothing is sent), all in s."""
    n = len(dur)
    pp = graph.schedule.pp
    offsets, dep, remote, dst = graph.offsets, graph.dep, graph.remote, graph.dst
    end = [-1.0] * n
    send = [-1.0] * n
    arrive = [-1.0] * n
    ptr = list(offsets[:-1])
    free = [0.0] * pp
    link_free = [0.0] * (pp * pp)
    left = n
    order = list(range(pp))
    while left:
        placed = 0
        for r in order:
            i, stop, t_free = ptr[r], offsets[r + 1], free[r]
            while i < stop:
                d = dep[i]
                start = t_free
                if d >= 0:
                    if remote[i]:
                        t = arrive[d]
                        if t < 0.0:
                            break
                        if t > start:
                            start = t
                    elif end[d] < 0.0:
                        break
                t_free = start + dur[i]
                end[i] = t_free
                to = dst[i]
                if to >= 0:
                    link = r * pp + to
                    s0 = link_free[link]
                    if t_free > s0:
                        s0 = t_free
                    send[i] = s0
                    link_free[link] = arrive[i] = s0 + xfer[i]
                else:
                    arrive[i] = t_free
                i += 1
            placed += i - ptr[r]
            ptr[r], free[r] = i, t_free
        if not placed:
            raise deadlock(graph, ptr, end)
        left -= placed
        order.reverse()
    return end, send, arrive


def deadlock(graph: ActionGraph, ptr: list[int], end: list[float]) -> ScheduleError:
    """Describe a stuck sweep: the first blocked rank, its action, and what that action waits for."""
    sched = graph.schedule
    flat = [a for row in sched.actions for a in row]
    blocked = [r for r in range(sched.pp) if ptr[r] < graph.offsets[r + 1]]
    heads = ", ".join(f"rank {r} at {flat[ptr[r]]}" for r in blocked)
    r = blocked[0]
    a_id = ptr[r]
    d = graph.dep[a_id]
    d_rank, _ = graph.rank_of(d)
    where = "which comes later on the same rank" if d_rank == r else f"on rank {d_rank}, which never runs"
    return ScheduleError(f"waits for {flat[d]} {where}: deadlock (blocked: {heads})", rank=r,
                         step=a_id - graph.offsets[r], action=str(flat[a_id]), source=sched.name)


def simulate_graph(graph: ActionGraph, times: StageTimes, *, w_hold: float = 0.5) -> Timeline:
    """Simulate a built graph with one set of stage times (build once, simulate many inside search).

    Args:
        graph: from ``build_graph(schedule)``.
        times: per-stage durations (s) and activation bytes, indexed by stage in pipeline order.
        w_hold: share of a micro-batch's activations that stays allocated between I and W (0..1).
    """
    dur, xfer = durations(graph, times)
    end, send, arrive = sweep(graph, dur, xfer)
    start = [e - d for e, d in zip(end, dur)]
    sched = graph.schedule
    busy, last, dp = [], [], []
    tails = times.dp_tail or (0.0,) * sched.pp
    for r in range(sched.pp):
        lo, hi = graph.offsets[r], graph.offsets[r + 1]
        busy.append(sum(dur[lo:hi]))
        e = end[hi - 1] if hi > lo else 0.0
        last.append(e)
        dp.append((e, e + tails[r]))
    pipe = max(last)
    step = max(pipe, max(hi for _, hi in dp))
    bubble = tuple(1.0 - b / pipe if pipe > 0 else 0.0 for b in busy)
    peak_bytes, peak_units = activation_peaks(graph, times.act_bytes, w_hold=w_hold)
    return Timeline(graph=graph, start=start, end=end, send_start=send, send_end=arrive, dp=tuple(dp),
                    pipeline_time=pipe, step_time=step, busy=tuple(busy), bubble=bubble,
                    peak_act_bytes=peak_bytes, peak_inflight=peak_units)


def simulate(schedule: Schedule | str, times: StageTimes, *, pp: int = 0, vpp: int = 1, n_micro: int = 0,
             w_hold: float = 0.5) -> Timeline:
    """Simulate one step of a schedule (a Schedule, or a registry name generated for pp, vpp, n_micro).

    Args:
        schedule: a Schedule (e.g. from ``load_schedule_csv``) or a name from ``schedule_names()``.
        times: per-stage durations (s) and activation bytes, stage index in pipeline order.
        pp: pipeline ranks (only with a name).
        vpp: chunks per rank (only with a name).
        n_micro: micro-batches per step (only with a name).
        w_hold: share of activations held between I and W (default 0.5, the ZB paper's M_W ~ M_B / 2).

    Raises:
        ScheduleError: the schedule is invalid or deadlocks (rank, step and action named).
    """
    if isinstance(schedule, str):
        schedule = get_schedule(schedule, pp=pp, vpp=vpp, n_micro=n_micro)
    return simulate_graph(build_graph(schedule), times, w_hold=w_hold)
