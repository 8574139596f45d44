"""A benchmark's latency-bound scenario (MLPerf Server): the highest Poisson rate whose p99 TTFT and TPOT stay
within the constraints, the TPOT percentile under Poisson arrivals, and the MLPerf rows read through them."""

from __future__ import annotations

import dataclasses
import math

import pytest

from meshplan import catalog
from meshplan.calibrate.serve_constants import load_constants
from meshplan.calibrate.serve_validate import predict_row, row_scenario, row_workload
from meshplan.cost.serve_capacity import sustainable_rate
from meshplan.cost.serve_load import predict_load
from meshplan.cost.serve_step import step_context
from meshplan.cost.serve_tail import quantile, tpot_quantile
from meshplan.errors import SpecError
from meshplan.spec.serving import ServePlan, Workload


def ctx_of(model="llama3.1-8b", gpus="1xh100-sxm", engine="trtllm"):
    pool = catalog.cluster(gpus).pools[0]
    return step_context(catalog.model(model), pool, ServePlan(tp=1, engine=engine), catalog.engine(engine),
                        load_constants())


def test_the_mlperf_dataset_carries_its_lengths_and_scenarios():
    d = catalog.dataset("openorca-mlperf")
    mean_in = sum(n * p for n, p in d.bins("input"))
    assert abs(mean_in - 222.3) < 1.0 and d.output_mean == 294  # tok_input_length mean; README 294.45
    assert abs(sum(n * p for n, p in d.bins("output")) - 294) < 2.0
    server = d.scenario("server")
    assert (server.ttft, server.tpot, server.percentile) == (2.0, 0.2, 0.99)
    assert d.scenario("interactive").tpot == 0.04
    with pytest.raises(SpecError, match="server, interactive"):
        d.scenario("offline")


def test_without_a_spread_the_tpot_quantile_is_the_mean():
    p = predict_load(ctx_of(), Workload(input_len=512, output_len=128, concurrency=16))
    assert p.tpot_spread == () and tpot_quantile(p, 0.99) == p.tpot


def test_one_output_length_gives_a_normal_quantile():
    p = predict_load(ctx_of(), Workload(input_len=512, output_len=128, rate=20.0))
    (sd, _), = p.tpot_spread
    assert sd > 0
    # z(0.99) = 2.3263 of the standard normal
    assert tpot_quantile(p, 0.99) == pytest.approx(p.tpot + 2.3263 * sd, rel=1e-4)
    assert tpot_quantile(p, 0.5) == pytest.approx(p.tpot, rel=1e-9)


def test_the_gap_spread_is_compound_poisson():
    """sd of one gap = marginal token cost x sqrt(lambda t E[L^2]): four times the rate doubles it (at the same
    gap), and a request's TPOT averages O - 1 of them."""
    ctx = ctx_of()
    from meshplan.cost.serve_load import step_sd, tpot_spread
    w = Workload(input_len=256, output_len=101, rate=1.0)
    sd5, sd20 = step_sd(ctx, w, x_req=5.0, gap=0.02), step_sd(ctx, w, x_req=20.0, gap=0.02)
    (a, _), = tpot_spread(w, sd5)
    (b, _), = tpot_spread(w, sd20)
    assert b == pytest.approx(2 * a, rel=1e-9) and a == pytest.approx(sd5 / 10, rel=1e-12)
    (c, _), = tpot_spread(dataclasses.replace(w, output_len=401), sd5)
    assert c == pytest.approx(a * math.sqrt(100 / 400), rel=1e-9)


@pytest.mark.parametrize("ttft, tpot", [(2.0, 0.2), (0.45, 0.04), (0.3, 0.012)])
def test_the_sustainable_rate_meets_its_bounds_and_no_more(ttft, tpot):
    ctx, work = ctx_of(), Workload(input_len=1024, output_len=256, rate=1.0)
    cap = sustainable_rate(ctx, work, replicas=2, ttft=ttft, tpot=tpot, q=0.99)
    assert cap.rate > 0 and cap.prediction is not None
    assert quantile(cap.prediction, "ttft", 0.99) <= ttft + 1e-9
    assert quantile(cap.prediction, "tpot", 0.99) <= tpot + 1e-9
    if cap.binding != "saturation":
        over = predict_load(ctx, dataclasses.replace(work, rate=cap.rate * 1.02), replicas=2)
        assert quantile(over, cap.binding, 0.99) > (ttft if cap.binding == "ttft" else tpot)
    offline = predict_load(ctx, dataclasses.replace(work, rate=0.0), replicas=2)
    assert cap.rate <= offline.requests_per_s * (1 + 1e-9)


def test_tighter_bounds_never_allow_more_load():
    ctx, work = ctx_of(), Workload(input_len=1024, output_len=256, rate=1.0)
    rates = [sustainable_rate(ctx, work, replicas=1, ttft=t, tpot=p, q=0.99).rate
             for t, p in ((2.0, 0.2), (0.45, 0.04), (0.3, 0.015), (0.3, 0.008))]
    assert rates == sorted(rates, reverse=True) and rates[-1] < rates[0]


def test_an_impossible_bound_has_no_rate():
    cap = sustainable_rate(ctx_of(), Workload(input_len=1024, output_len=256, rate=1.0), replicas=1,
                           ttft=0.001, tpot=0.2, q=0.99)
    assert cap.rate == 0 and cap.prediction is None


MLPERF = {"id": "m", "model_key": "llama2-70b", "gpu_key": "h200", "tp": "1", "pp": "1", "dp": "8", "ep": "1",
          "precision": "fp8", "framework": "TensorRT-LLM (NVIDIA MLPerf v4.1 harness)",
          "input_len": "OpenOrca (variable)", "output_len": "OpenOrca (variable, max 1024)", "batch": "896",
          "concurrency": "server (Poisson)", "metric": "requests_per_s", "value": "100", "notes": ""}


def test_a_server_row_runs_at_the_sustainable_rate():
    got, why = predict_row(MLPERF, load_constants())
    assert why == "" and got is not None
    off, _ = predict_row(MLPERF | {"concurrency": "offline"}, load_constants())
    inter, _ = predict_row(MLPERF | {"concurrency": "interactive"}, load_constants())
    assert inter.predicted < got.predicted <= off.predicted * 1.001


def test_the_batch_column_pins_the_running_batch():
    small, _ = predict_row(MLPERF | {"concurrency": "offline", "batch": "64"}, load_constants())
    big, _ = predict_row(MLPERF | {"concurrency": "offline", "batch": "896"}, load_constants())
    assert small.predicted < 0.5 * big.predicted


def test_a_scenario_needs_a_dataset_that_defines_it():
    fixed = MLPERF | {"input_len": "1024", "output_len": "128"}
    with pytest.raises(SpecError, match=r"m\.concurrency.*openorca-mlperf"):
        row_scenario(fixed)
    assert row_workload(MLPERF).offline  # the scenario's rate is found later, from the offline lengths
