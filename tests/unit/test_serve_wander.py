"""The open loop's resident batch wanders about its fixed point (linear-noise approximation of the birth-death
chain whose departure rate is the engine's throughput at that batch), and each request's TPOT with it."""

from __future__ import annotations

import dataclasses
import math

import pytest

from meshplan import catalog
from meshplan.calibrate.serve_constants import load_constants
from meshplan.cost.serve_load import predict_load
from meshplan.cost.serve_step import step_context
from meshplan.cost.serve_tail import quantile
from meshplan.cost.serve_wander import Wander, wander
from meshplan.spec.serving import ServePlan, Workload

WORK = Workload(input_len=256, output_len=128, rate=1.0)


def proportional(service: float, t0: float, per_request: float):
    """A server whose throughput grows in proportion to the batch (every request takes ``service`` s), whose
    token time is t0 + per_request x R."""
    return lambda ctx, work, r: (0.0, 0.0, service, t0 + per_request * r)


def test_a_proportional_server_holds_the_poisson_variance():
    """M/G/infinity: X(R) = R / S, so X' = 1 / S and the variance lambda / X' = lambda S, the mean (Poisson)."""
    w = wander(None, WORK, proportional(4.0, 0.01, 2e-4), resident=100, cap=1000, rate=25.0)
    assert w.relax == pytest.approx(0.25) and w.sd == pytest.approx(math.sqrt(25.0 * 4.0))
    assert w.slope == pytest.approx(2e-4)


def test_a_saturating_server_wanders_further():
    """X(R) = R / (a + b R) flattens as R grows: at the same rate a flatter curve (larger b) lets the batch wander
    more. Central differences of a hyperbola: X'(R) = a / (a + b R)^2 up to second order."""
    def curve(a, b):
        return lambda ctx, work, r: (0.0, 0.0, a + b * r, 0.0)
    flat, steep = (wander(None, WORK, curve(2.0, b), resident=400, cap=2000, rate=10.0) for b in (0.01, 0.001))
    assert flat.sd > steep.sd
    assert flat.relax == pytest.approx(2.0 / (2.0 + 0.01 * 400) ** 2, rel=2e-3)  # h = R / 20


def test_no_wander_at_the_cap_or_without_arrivals():
    steady = proportional(4.0, 0.01, 2e-4)
    assert wander(None, WORK, steady, resident=1000, cap=1000, rate=25.0) is None  # pinned: the queue takes it
    assert wander(None, WORK, steady, resident=100, cap=1000, rate=0.0) is None
    # a throughput that falls as the batch grows has no stable fixed point to wander about
    assert wander(None, WORK, lambda c, w, r: (0.0, 0.0, r * r, 0.0), resident=100, cap=1000, rate=1.0) is None


def test_a_request_averages_the_wander_over_its_life():
    """An Ornstein-Uhlenbeck process averaged over L keeps 2 (x - 1 + e^-x) / x^2 of its variance (x = L / tau):
    all of it for a short life, 2 / e at x = 1, about 2 / x for a long one."""
    w = Wander(sd=50.0, relax=0.01, slope=2e-4)
    assert w.tpot_sd(0.0) == pytest.approx(0.01)
    assert w.tpot_sd(100.0) == pytest.approx(0.01 * math.sqrt(2 / math.e))
    assert w.tpot_sd(1e5) == pytest.approx(0.01 * math.sqrt(2 / 1e3), rel=2e-3)


def test_the_tpot_tail_widens_towards_saturation():
    """Llama-3.1-8B on one H100 under TensorRT-LLM: at nine tenths of the offline rate the p99 TPOT stands further
    above the median than at a third of it."""
    ctx = step_context(catalog.model("llama3.1-8b"), catalog.cluster("1xh100-sxm").pools[0],
                       ServePlan(tp=1, engine="trtllm"), catalog.engine("trtllm"), load_constants())
    work = Workload(input_len=512, output_len=256)
    top = predict_load(ctx, work).requests_per_s

    def spread(share: float) -> float:
        p = predict_load(ctx, dataclasses.replace(work, rate=share * top))
        return quantile(p, "tpot", 0.99) / quantile(p, "tpot", 0.5)

    assert spread(0.9) > spread(0.33) > 1.0
