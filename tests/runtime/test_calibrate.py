"""meshplan calibrate: the fits recover known constants, the profile loads in the catalog and the estimate,
and a real benchmark run on this machine gives a usable profile."""

from __future__ import annotations

import json
import math

import pytest

from meshplan import catalog
from meshplan.calibrate.local import (
    attention_flops,
    fit_gemm_curve,
    fit_link,
    fit_profile,
)
from meshplan.cli.calibrate import profile_toml
from meshplan.cost.compute import shape_eff
from meshplan.cost.estimate import estimate
from meshplan.spec.calibration import Calibration
from meshplan.spec.plan import Plan

SHAPES = [(64, 64, 64), (256, 256, 256), (1024, 1024, 1024), (2048, 256, 704), (32, 1024, 1024)]


def synthetic_bench(*, rate: float = 5e10, n_half: float = 32.0) -> dict:
    """Timings a device with exactly the cost model's curves would produce."""
    calib = Calibration(n_half=n_half)
    gemm = [[m, n, k, 2 * m * n * k / (rate * shape_eff(m, n, k, calib))] for m, n, k in SHAPES]
    att = [2, 8, 256, 32]
    coll = {"all_reduce": {"2": [[b, 2 * 100e-6 + 1.0 * b / 1e9] for b in (4096, 2**20, 16 * 2**20)]},
            "all_gather": {"2": [[b, 1 * 100e-6 + 0.5 * b / 1e9] for b in (4096, 2**20, 16 * 2**20)]}}
    return {"device": "cpu", "device_name": "cpu", "dtype": "fp32", "world": 2, "threads": 1,
            "memory_bytes": 8 * 2**30, "op_overhead_s": 1e-5, "dtensor_overhead_s": 2e-5, "sync_s": 2e-3,
            "gemm": gemm,
            "attention": {"shape": att, "fwd_s": 0.01, "fwd_bwd_s": attention_flops(att) * 3.5 / (0.25 * rate)},
            "copy": {"bytes": 2**26, "s": 2 * 2**26 / 2e10}, "collectives": coll}


def test_gemm_curve_recovers_rate_and_n_half():
    rate, n_half = fit_gemm_curve(synthetic_bench()["gemm"])
    assert rate == pytest.approx(5e10, rel=0.02)
    assert n_half == pytest.approx(32.0, rel=0.04)  # the grid steps by 2**(1/20) = 3.5 %


def test_link_fit_recovers_latency_and_bandwidth():
    rows = [("all_reduce", 2, b, 2 * 100e-6 + b / 1e9) for b in (4096, 2**20, 2**24)]
    lat, bw = fit_link(rows)
    assert lat == pytest.approx(100e-6, rel=1e-6)
    assert bw == pytest.approx(1e9, rel=1e-6)


def test_attention_flops_counts_causal_qk_and_av():
    # 2 * tokens(512) * kv(256) * heads(8) * (32 + 32) / 2 (causal)
    assert attention_flops([2, 8, 256, 32]) == 2 * 512 * 256 * 8 * 64 / 2


def test_profile_round_trips_and_drives_the_estimate(tmp_path):
    path = tmp_path / "hw.toml"
    path.write_text(profile_toml(synthetic_bench(), base="cpu", name="hw"))
    gpu = catalog.gpu(str(path))
    cal = dict(gpu.calibration)
    assert gpu.peak_flops("fp32") == pytest.approx(5e10, rel=0.02)
    assert gpu.peak_flops("bf16") == gpu.peak_flops("fp32")  # CPU: bf16 falls back to the fp32 peak
    assert cal["gemm_eff"] == 1.0 and cal["n_half"] == pytest.approx(32.0, rel=0.04)
    assert cal["attn_eff"] == pytest.approx(0.25, rel=0.03)
    assert gpu.hbm_bandwidth == pytest.approx(2e10, rel=1e-3)
    assert gpu.intra_latency == pytest.approx(100e-6, rel=1e-3)
    assert gpu.intra_bandwidth == pytest.approx(1e9, rel=1e-3)
    assert cal["dtensor_overhead_s"] == 2e-5 and cal["sync_s"] == 2e-3
    cluster = catalog.cluster(f"2x{path}")
    plan = Plan(global_batch=4, seq_len=256, micro_batch=2, dp=2, precision="fp32")
    est = estimate(catalog.model("small-llama"), cluster, plan)
    assert 0.05 < est.step_time < 5.0


def test_sync_cost_adds_per_tp_collective(tmp_path):
    # small-llama, tp2+sp, mb2 of 4: 2 micro-batches x 8 layers x (attention + MLP) x (all-gather +
    # reduce-scatter) x (forward + backward) = 128 blocking collectives, each 2 ms of host sync = 0.256 s.
    path = tmp_path / "hw.toml"
    bench = synthetic_bench()
    path.write_text(profile_toml(bench, base="cpu", name="hw"))
    quiet = tmp_path / "quiet.toml"
    quiet.write_text(profile_toml({**bench, "sync_s": 0.0}, base="cpu", name="quiet"))
    plan = Plan(global_batch=4, seq_len=256, micro_batch=2, tp=2, sp=True, precision="fp32")
    model = catalog.model("small-llama")
    gap = estimate(model, catalog.cluster(f"2x{path}"), plan).step_time - \
        estimate(model, catalog.cluster(f"2x{quiet}"), plan).step_time
    assert gap == pytest.approx(128 * 2e-3, rel=1e-9)
    no_sp = plan.with_(sp=False)  # one all-reduce per block and direction: half the calls
    gap = estimate(model, catalog.cluster(f"2x{path}"), no_sp).step_time - \
        estimate(model, catalog.cluster(f"2x{quiet}"), no_sp).step_time
    assert gap == pytest.approx(64 * 2e-3, rel=1e-9)
    fsdp = Plan(global_batch=4, seq_len=256, micro_batch=1, dp=2, zero=3, precision="fp32")
    # 2 micro-batches x 8 layers x (all-gather forward; all-gather + reduce-scatter backward) = 48 calls
    gap = estimate(model, catalog.cluster(f"2x{path}"), fsdp).step_time - \
        estimate(model, catalog.cluster(f"2x{quiet}"), fsdp).step_time
    assert gap == pytest.approx(48 * 2e-3, rel=1e-9)


def test_gpu_base_keeps_datasheet_peak_and_fits_efficiencies():
    gpu = fit_profile(synthetic_bench(), base=catalog.gpu("h100-sxm"), name="mine")
    h100 = catalog.gpu("h100-sxm")
    assert gpu.peak_flops("fp32") == h100.peak_flops("fp32")
    assert dict(gpu.calibration)["gemm_eff"] == pytest.approx(5e10 / h100.peak_flops("fp32"), rel=0.02)


@pytest.mark.runtime
def test_calibrate_command_on_this_machine(local_profile):
    out = local_profile  # `meshplan calibrate --nproc 2` run once for the session (tests/runtime/conftest.py)
    gpu = catalog.gpu(str(out))
    cal = dict(gpu.calibration)
    assert 1e9 < gpu.peak_flops("fp32") < 1e13  # 1 GFLOP/s .. 10 TFLOP/s per CPU process
    assert 0.01 < cal["attn_eff"] < 3.0 and 1.0 <= cal["n_half"] <= 4096
    assert 1e8 < gpu.hbm_bandwidth < 1e12 and 1e7 < gpu.intra_bandwidth < 1e11
    assert 0 <= gpu.intra_latency < 0.05 and math.isfinite(cal["launch_s"])
    assert 0 <= cal["sync_s"] < 0.05 and 0 <= cal["dtensor_overhead_s"] < 1e-3
    est = estimate(catalog.model("small-llama"), catalog.cluster(f"2x{out}"),
                   Plan(global_batch=4, seq_len=256, micro_batch=2, dp=2, precision="fp32"))
    assert 0.01 < est.step_time < 20
    json.dumps(cal)
