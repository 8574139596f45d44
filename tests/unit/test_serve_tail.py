"""Percentiles of a serving prediction when lengths vary and arrivals land mid-step: TTFT waits for the step under
way (uniform remainder), for the step its prompt joins (normal spread) and for its own prompt's prefill; E2E also
for its own output. Hand-built predictions check the closed forms; a real workload checks the direction."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan import catalog
from meshplan.calibrate.serve_constants import load_constants
from meshplan.cost.serve_load import ServePrediction, about_mean, decode_spread, predict_load
from meshplan.cost.serve_step import step_context
from meshplan.cost.serve_tail import RESIDUAL_POINTS, quantile, shifted_wait_quantile, wait_quantile
from meshplan.spec.serving import ServePlan, Workload


def pred(**kw) -> ServePrediction:
    """A prediction with 1 s TTFT and 10 s E2E, no wait unless ``kw`` gives one."""
    base = dict(ttft=1.0, tpot=0.01, itl=0.01, e2e=10.0, queue_wait=0.0, output_tokens_per_s=1.0,
                requests_per_s=1.0, resident=1, kv_capacity_tokens=1, kv_occupancy=0.0, limited_by="load",
                decode_step=0.01, prefill=0.1)
    return ServePrediction(**(base | kw))


def test_with_nothing_spread_the_quantile_is_the_mean():
    p = pred()
    assert quantile(p, "ttft", 0.99) == 1.0 and quantile(p, "e2e", 0.99) == 10.0


def test_the_step_under_way_is_a_uniform_remainder():
    """Seven equal shares of a 0.12 s step, about its mean: the p99 request lands at the start of the step, so it
    waits the top share's midpoint, (6.5 / 7 - 1/2) x 0.12 s beyond the mean half-step; the median the mean."""
    assert RESIDUAL_POINTS == 7
    p = pred(residual_span=0.12)
    assert quantile(p, "ttft", 0.99) == pytest.approx(1.0 + (6.5 / 7 - 0.5) * 0.12, abs=1e-12)
    assert quantile(p, "ttft", 0.5) == pytest.approx(1.0, abs=1e-12)


def test_two_prompt_lengths_under_an_exponential_wait():
    """Half the prompts 1 s shorter than the mean prefill, half 1 s longer; half the requests wait, 0.4 s on
    average among them (mean wait 0.2 s). The p90 lies in the long prompts' tail: 0.5 x 0.5 e^(-2.5 (x - 1))
    plus the short ones' 0.5 x 0.5 e^(-2.5 (x + 1)) = 0.1, so x = 1 + ln(0.25 (1 + e^-5) / 0.1) / 2.5."""
    p = pred(ttft=2.0, queue_wait=0.2, wait_prob=0.5, prefill_spread=((-1.0, 0.5), (1.0, 0.5)))
    x = 1 + math.log(0.25 * (1 + math.exp(-5)) / 0.1) / 2.5
    assert quantile(p, "ttft", 0.9) == pytest.approx(2.0 - 0.2 + x, rel=1e-9)
    # the median request is a short prompt that waited, or a long one that did not: 0.5 x (1 - 0.5) + ... = 0.5
    assert 2.0 - 0.2 - 1.0 <= quantile(p, "ttft", 0.5) <= 2.0 - 0.2 + 1.0


def test_the_e2e_tail_is_the_longest_outputs():
    """No wait, outputs of 100 or 1000 tokens at 10 ms (mean 190 charged in e2e): with 10 % long ones the p95
    request generated 1000 tokens, (1000 - 190) x 10 ms beyond the mean; the p50 one 100, (100 - 190) x 10 ms
    short of it."""
    work = Workload(input_len=100, output_len=190, output_hist=((100, 0.9), (1000, 0.1)))
    spread = decode_spread(work, 0.01)
    assert [x for pair in spread for x in pair] == pytest.approx([-0.9, 0.9, 8.1, 0.1])
    p = pred(decode_spread=spread, residual_span=0.01)
    assert quantile(p, "e2e", 0.95) == pytest.approx(10.0 + 8.1, abs=1e-9)
    assert quantile(p, "e2e", 0.5) == pytest.approx(10.0 - 0.9, abs=1e-9)


def test_about_mean_keeps_the_weighted_mean():
    assert [x for pair in about_mean(((3.0, 0.25), (1.0, 0.75))) for x in pair] == pytest.approx(
        [1.5, 0.25, -0.5, 0.75])
    assert about_mean(((3.0, 1.0),)) == ()


@settings(max_examples=60, deadline=None)
@given(q1=st.floats(0.01, 0.98), dq=st.floats(0.001, 0.5), prob=st.floats(0.0, 1.0),
       wait=st.floats(0.0, 2.0), sd=st.floats(0.0, 0.1), span=st.floats(0.0, 0.2),
       lo=st.floats(-1.0, 0.0), hi=st.floats(0.0, 3.0))
def test_quantiles_grow_with_q_and_stay_in_the_support(q1, dq, prob, wait, sd, span, lo, hi):
    q2 = min(q1 + dq, 0.999)
    p = pred(ttft=1.0 + wait, queue_wait=wait, wait_prob=prob, step_sd=sd, residual_span=span,
             prefill_spread=((lo, 0.5), (hi, 0.5)))
    a, b = quantile(p, "ttft", q1), quantile(p, "ttft", q2)
    assert a <= b + 1e-9
    floor = 1.0 + lo + (-0.5 * span) - 3 * sd  # no wait, the shortest prompt, landing at a step's end
    assert a >= floor - 1e-9
    assert b <= 1.0 + hi + span + 3 * sd + wait_quantile(p, q2) + 1e-9


def test_a_longer_wait_never_lowers_a_quantile():
    parts = (((-0.5, 0.3), (0.2, 0.7)),)
    short = pred(ttft=1.1, queue_wait=0.1, wait_prob=0.6)
    long = dataclasses.replace(short, ttft=1.3, queue_wait=0.3)
    for q in (0.5, 0.9, 0.99):
        assert shifted_wait_quantile(long, parts, q) >= shifted_wait_quantile(short, parts, q) - 1e-9


def test_a_real_histogram_workload_spreads_its_tails():
    """MLPerf's OpenOrca lengths on one H100 at a light Poisson load: the p99 E2E is several means (the top
    output bin holds 912 tokens against a mean of 294), the median below the mean; long prompts lift the p99
    TTFT above its mean."""
    model, pool = catalog.model("llama3.1-8b"), catalog.cluster("1xh100-sxm").pools[0]
    d = catalog.dataset("openorca-mlperf")
    work = d.workload(rate=2.0)
    for engine in ("trtllm", "vllm-0.6.0"):
        ctx = step_context(model, pool, ServePlan(tp=1, engine=engine), catalog.engine(engine), load_constants())
        p = predict_load(ctx, work)
        assert len(p.prefill_spread) == len(d.bins("input")) and len(p.decode_spread) == len(d.bins("output"))
        assert quantile(p, "e2e", 0.99) > 2.5 * p.e2e
        assert quantile(p, "e2e", 0.5) < p.e2e
        assert quantile(p, "ttft", 0.99) > p.ttft
        # the longest prompt is the slowest to its first token, the shortest the quickest
        offsets = [x for x, _ in p.prefill_spread]
        assert offsets[-1] == max(offsets) > 0 > min(offsets) == offsets[0]


def test_disaggregated_serving_spreads_its_tails_too():
    """The decode pool's E2E waits each request's own output and the prefill pool's TTFT its own prompt: the
    offsets are the plain decode step per token beyond the mean output, and each prompt length's lone prefill."""
    from meshplan.cost.serve_disagg import predict_disagg
    from meshplan.cost.serve_step import prefill_time

    model, pool = catalog.model("llama3.1-8b"), catalog.cluster("2xh100-sxm").pools[0]
    ctx = step_context(model, pool, ServePlan(tp=1, engine="vllm"), catalog.engine("vllm"), load_constants())
    work = catalog.dataset("openorca-mlperf").workload(rate=2.0)
    p = predict_disagg(ctx, ctx, work, n_prefill=1, n_decode=1)
    (n, _), (d, _) = max(work.bins("output")), max(p.decode_spread)
    assert d == pytest.approx((n - work.output_len) * p.tpot)
    firsts = [prefill_time(ctx, tokens=n) for n, _ in work.bins("input")]
    assert p.prefill_spread[-1][0] - p.prefill_spread[0][0] == pytest.approx(firsts[-1] - firsts[0])
    assert quantile(p, "e2e", 0.99) > 2.5 * p.e2e and quantile(p, "ttft", 0.99) > p.ttft
