"""The closed forms of meshplan.cost.pipeline agree with the simulator on uniform stages, and the zero-bubble
and DualPipeV schedules show their papers' bubble/memory trade-off."""

from __future__ import annotations

import pytest
from sim_helpers import uniform

from meshplan.cost.pipeline import closed_form, inflight_microbatches
from meshplan.sim import simulate

CASES = [(name, p, v, m) for name, vs in (("gpipe", (1,)), ("looped_bfs", (2,)), ("1f1b", (1,)),
                                          ("interleaved_1f1b", (2, 3, 4)), ("zb_h1", (1,)))
         for v in vs for p in (2, 3, 4, 8) for m in (p, 2 * p, 3 * p, 2 * p + 1) if not (v > 1 and m % max(1, m // p))]
SHAPES = [(1.0, 1.0, 1.0), (1.0, 2.0, 0.5), (2.0, 1.0, 1.0), (1.0, 1.0, 2.0)]


@pytest.mark.parametrize("p,m", [(2, 2), (4, 4), (4, 8), (8, 16), (8, 64)])
def test_1f1b_bubble_is_p_minus_1_over_m_plus_p_minus_1(p, m):
    tl = simulate("1f1b", uniform(p), pp=p, vpp=1, n_micro=m)
    assert tl.pipeline_time == pytest.approx(3.0 * (m + p - 1))
    assert tl.bubble == pytest.approx([(p - 1) / (m + p - 1)] * p)


@pytest.mark.parametrize("p,v,m", [(4, 2, 8), (4, 4, 8), (8, 2, 16), (8, 4, 32)])
def test_interleaved_bubble_relative_is_p_minus_1_over_v_m(p, v, m):
    tl = simulate("interleaved_1f1b", uniform(p * v, f=1 / v, i=1 / v, w=1 / v), pp=p, vpp=v, n_micro=m)
    ideal = 3.0 * m
    assert (tl.pipeline_time - ideal) / ideal == pytest.approx((p - 1) / (v * m))


@pytest.mark.parametrize("name,p,v,m", CASES)
def test_closed_form_equals_simulator_on_uniform_stages(name, p, v, m):
    for f, i, w in SHAPES:
        times = uniform(p * v, f=f / v, i=i / v, w=w / v)
        tl = simulate(name, times, pp=p, vpp=v, n_micro=m)
        cf = closed_form(name, times, pp=p, vpp=v, n_micro=m)
        assert cf.step == pytest.approx(tl.pipeline_time, rel=1e-12)
        assert cf.busy == pytest.approx(max(tl.busy))


@pytest.mark.parametrize("name,p,v,m", CASES)
def test_closed_form_transfer_term_within_a_few_sends(name, p, v, m):
    t = 0.01
    times = uniform(p * v, f=1 / v, i=1 / v, w=1 / v, t=t)
    tl = simulate(name, times, pp=p, vpp=v, n_micro=m)
    cf = closed_form(name, times, pp=p, vpp=v, n_micro=m)
    assert abs(cf.step - tl.pipeline_time) <= 6 * p * v * t


def test_1f1b_transfer_term_exact_when_pp_divides_m():
    times = uniform(4, t=0.1)
    tl = simulate("1f1b", times, pp=4, vpp=1, n_micro=8)
    assert tl.pipeline_time == pytest.approx(34.6)  # 33 + 2 t ((p-1)(1 + m/p) - 1) = 33 + 0.2 * 8
    assert closed_form("1f1b", times, pp=4, vpp=1, n_micro=8).step == pytest.approx(34.6)


@pytest.mark.parametrize("name,vpp,m", [("zbv", 2, 16), ("dualpipev", 2, 16), ("zbv", 2, 7)])
def test_v_shaped_closed_form_exact_when_f_i_w_equal(name, vpp, m):
    times = uniform(8, f=0.5, i=0.5, w=0.5)
    tl = simulate(name, times, pp=4, vpp=vpp, n_micro=m)
    assert closed_form(name, times, pp=4, vpp=vpp, n_micro=m).step == pytest.approx(tl.pipeline_time)


@pytest.mark.parametrize("name,p,v,m", CASES + [("zbv", p, 2, m) for p in (2, 4, 8) for m in (3, 2 * p, 3 * p)]
                         + [("dualpipev", p, 2, m) for p in (2, 4, 8) for m in (2 * p, 3 * p)])
def test_inflight_closed_form_equals_simulated_peaks(name, p, v, m):
    tl = simulate(name, uniform(p * v), pp=p, vpp=v, n_micro=m)
    want = [inflight_microbatches(name, pp=p, vpp=v, n_micro=m, rank=r) for r in range(p)]
    assert list(tl.peak_inflight) == pytest.approx(want)


def test_gpipe_holds_all_microbatches_and_1f1b_holds_p_minus_rank():
    assert simulate("gpipe", uniform(4), pp=4, vpp=1, n_micro=12).peak_inflight == (12, 12, 12, 12)
    assert simulate("1f1b", uniform(4), pp=4, vpp=1, n_micro=12).peak_inflight == (4, 3, 2, 1)
    tl = simulate("1f1b", uniform(4, act=3e9), pp=4, vpp=1, n_micro=12)
    assert tl.peak_act_bytes == (12e9, 9e9, 6e9, 3e9)


def test_interleaved_first_rank_holds_p_plus_p_minus_1_over_v():
    # Korthikanti et al. 2022 sec. 4.2.3: p (1 + (p-1)/(p v)) micro-batches on the first stage.
    tl = simulate("interleaved_1f1b", uniform(16), pp=8, vpp=2, n_micro=32)
    assert tl.peak_inflight[0] == pytest.approx(8 + 7 / 2)


def test_zero_bubble_and_dualpipev_trade_memory_for_bubble():
    """p=8, m=32, per rank F = I = W = 1 s. Bubbles (s): 1F1B (p-1)(F+I+W) = 21; ZB-H1 (p-1)(F+I-W) = 7
    (Qi et al. 2023); ZB-V and DualPipeV 3.5. Memory: ZB-H1 keeps 1F1B's first-rank peak p but later ranks
    hold half-micro-batch W residues; ZB-V holds p on every rank (1F1B: p - r); DualPipeV p + 1/2 everywhere
    (DeepSeek-AI 2024: PP + 1 chunk activations), more than 1F1B's worst rank."""
    p, m = 8, 32
    one = simulate("1f1b", uniform(p), pp=p, vpp=1, n_micro=m)
    zb = simulate("zb_h1", uniform(p), pp=p, vpp=1, n_micro=m)
    zbv = simulate("zbv", uniform(2 * p, f=0.5, i=0.5, w=0.5), pp=p, vpp=2, n_micro=m)
    dpv = simulate("dualpipev", uniform(2 * p, f=0.5, i=0.5, w=0.5), pp=p, vpp=2, n_micro=m)
    bubble = {k: tl.pipeline_time - 3.0 * m for k, tl in (("1f1b", one), ("zb", zb), ("zbv", zbv), ("dpv", dpv))}
    assert bubble == pytest.approx({"1f1b": 21.0, "zb": 7.0, "zbv": 3.5, "dpv": 3.5})
    assert max(zb.peak_inflight) == max(one.peak_inflight) == 8
    assert zb.peak_inflight[-1] == 1 + 0.5 * 7 > one.peak_inflight[-1]
    assert zbv.peak_inflight == (8.0,) * p and sum(zbv.peak_inflight) > sum(one.peak_inflight)
    assert dpv.peak_inflight == (8.5,) * p and max(dpv.peak_inflight) > max(one.peak_inflight)
