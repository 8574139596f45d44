"""The simulator against hand-computed timelines, and invariants that must hold for any stage times."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_helpers import uniform

from meshplan.cost.result import StageTimes
from meshplan.sim import (
    ScheduleError,
    build_graph,
    get_schedule,
    simulate,
    simulate_graph,
)


def test_1f1b_two_ranks_by_hand():
    """pp=2, m=2, F=1, I=W=1 (B=2), sends 0.5 s. Rank 1: F0 [1.5,2.5] B0 [2.5,4.5] F1 [4.5,5.5] B1 [5.5,7.5];
    rank 0: F0 [0,1] F1 [1,2] B0 waits for the gradient at 5.0 -> [5,7], B1 for 8.0 -> [8,10]."""
    times = StageTimes(fwd=(1.0, 1.0), bwd_input=(1.0, 1.0), bwd_weight=(1.0, 1.0), p2p=(0.5, 0.0),
                       act_bytes=(10.0, 20.0), dp_tail=(3.0, 1.0))
    tl = simulate("1f1b", times, pp=2, vpp=1, n_micro=2)
    assert tl.start == [0.0, 1.0, 5.0, 8.0, 1.5, 2.5, 4.5, 5.5]
    assert tl.end == [1.0, 2.0, 7.0, 10.0, 2.5, 4.5, 5.5, 7.5]
    assert tl.send_start[:2] == [1.0, 2.0] and tl.send_end[:2] == [1.5, 2.5]  # the second send queues on the link
    assert tl.pipeline_time == 10.0
    assert tl.dp == ((10.0, 13.0), (7.5, 8.5))
    assert tl.step_time == 13.0
    assert tl.busy == (6.0, 6.0) and tl.bubble == pytest.approx((0.4, 0.4))
    assert tl.peak_act_bytes == (20.0, 20.0) and tl.peak_inflight == (2.0, 1.0)
    assert tl.n_events == 8 + 4


def test_w_hold_share_stays_between_i_and_w():
    # zb_h1 rank 1 of 2 holds F0, then after I0 keeps w_hold of it while F1 allocates: peak 1 + w_hold.
    for hold in (0.0, 0.25, 1.0):
        tl = simulate("zb_h1", uniform(2), pp=2, vpp=1, n_micro=4, w_hold=hold)
        assert tl.peak_inflight[1] == pytest.approx(1 + hold)


def test_v_turn_costs_no_transfer():
    sched = get_schedule("zbv", pp=2, vpp=2, n_micro=4)
    graph = build_graph(sched)
    # F of stage 1 (rank 1) feeds stage 2 on the same rank: no send; stage 0 -> 1 crosses ranks.
    hops = {(sched.actions[0] + sched.actions[1])[i] : graph.hop[i] for i in range(len(graph.hop))}
    assert hops[("F", 1, 0)] == -1 and hops[("F", 0, 0)] == 0 and hops[("F", 2, 0)] == 2


def test_stage_times_must_cover_the_schedule():
    with pytest.raises(ScheduleError, match="cover 4 stages, the schedule has 8"):
        simulate("interleaved_1f1b", uniform(4), pp=4, vpp=2, n_micro=8)


def test_graph_reused_across_times_gives_same_result():
    graph = build_graph(get_schedule("interleaved_1f1b", pp=4, vpp=2, n_micro=8))
    a = simulate_graph(graph, uniform(8, t=0.01))
    b = simulate("interleaved_1f1b", uniform(8, t=0.01), pp=4, vpp=2, n_micro=8)
    assert a.pipeline_time == b.pipeline_time and a.end == b.end


stage_time = st.floats(min_value=0.01, max_value=2.0, allow_nan=False)


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(["gpipe", "1f1b", "zb_h1"]), p=st.integers(2, 5), m=st.integers(1, 10),
       data=st.data())
def test_step_bounds_and_monotonicity(name, p, m, data):
    fwd = tuple(data.draw(stage_time) for _ in range(p))
    bi = tuple(data.draw(stage_time) for _ in range(p))
    bw = tuple(data.draw(stage_time) for _ in range(p))
    p2p = tuple(data.draw(st.floats(0.0, 0.5)) for _ in range(p - 1)) + (0.0,)
    times = StageTimes(fwd=fwd, bwd_input=bi, bwd_weight=bw, p2p=p2p, act_bytes=(1.0,) * p)
    tl = simulate(name, times, pp=p, vpp=1, n_micro=m)
    # No rank works more than the step; one micro-batch's round trip is a lower bound.
    assert tl.pipeline_time >= max(tl.busy) - 1e-9
    assert tl.pipeline_time >= sum(fwd) + sum(bi) + min(bw) + 2 * sum(p2p) - 1e-9
    # A slower stage never makes the step faster.
    k = data.draw(st.integers(0, p - 1))
    slower = StageTimes(fwd=fwd[:k] + (fwd[k] * 1.5,) + fwd[k + 1:], bwd_input=bi, bwd_weight=bw, p2p=p2p,
                        act_bytes=(1.0,) * p)
    assert simulate(name, slower, pp=p, vpp=1, n_micro=m).pipeline_time >= tl.pipeline_time - 1e-9
    assert all(0.0 <= b < 1.0 for b in tl.bubble)
