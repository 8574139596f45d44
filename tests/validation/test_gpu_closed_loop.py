"""The cost model against a real GPU: measurements recorded on one H200 by scripts/gpu_closed_loop.sh
(Llama-3.2-1B, bf16, every recompute mode x micro-batch 2/4/8, each plan alone on the device), re-predicted
with today's model. CI has no GPU; the measurements are data, the predictions are recomputed."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

RESULTS = Path(__file__).parents[2] / "benchmarks" / "results"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_gpu", RESULTS.parent / "bench_gpu_closed_loop.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def recorded() -> dict:
    return json.loads((RESULTS / "h200-llama3.2-1b-check.json").read_text())


def test_peak_memory_of_every_plan_within_5_percent_of_the_gpu(recorded):
    # torch.cuda.max_memory_allocated of each plan alone on the device vs the cost model's tensors (the reserve
    # for context and fragmentation excluded on both sides): the 5 % bound, on real hardware.
    s = _bench().rescore(recorded, "h200")
    assert len(s["plans"]) == 9
    for r in s["plans"]:
        assert abs(r["memory_error_pct"]) <= 5.0, r


def test_calibrated_profile_ranks_the_gpu_plans(recorded):
    # With the profile `meshplan calibrate` measured on that GPU (host time per op included), the predicted
    # order of the 9 plans follows the measured one (tau 0.89 with today's model) and the chosen plan is the fastest.
    s = _bench().rescore(recorded, str(RESULTS / "h200-local.toml"))
    assert s["kendall_tau"] >= 0.7 and s["regret_pct"] == 0.0
    assert s["mape_pct"] <= 20.0


def test_host_bound_small_micro_batches_are_slower():
    # The host floor: one step of 8 micro-batches of the 1B model issues ~8x the layer ops of one micro-batch
    # of 8, so the first is predicted slower, as measured (0.52 vs 0.34 s at mb2 vs mb8): with the host time
    # per op calibrate measured on that GPU, and with the catalog's default (the same measurement).
    from meshplan import catalog
    from meshplan.cli.check import predict_all
    from meshplan.spec.plan import Plan

    plans = [Plan(global_batch=8, seq_len=2048, micro_batch=m, precision="bf16", framework="meshplan")
             for m in (1, 8)]
    loop = catalog.framework("meshplan").with_(fused_optimizer=False)
    for profile in (str(RESULTS / "h200-local.toml"), "h200"):
        (t1, _), (t8, _) = predict_all("llama3.2-1b", profile, plans, 1, loop)
        assert t1 > 1.3 * t8, profile


def test_catalog_profile_ranks_the_gpu_plans(recorded):
    # The catalog h200 (datasheet peaks, fitted efficiencies, default host time per op): tau 0.89, MAPE 8.8 %
    # when this was written (0.56 and 26 % before the host floor was a catalog default).
    s = _bench().rescore(recorded, "h200")
    assert s["kendall_tau"] >= 0.7 and s["regret_pct"] == 0.0
    assert s["mape_pct"] <= 20.0
