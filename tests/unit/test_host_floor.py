"""The GPU host floor: asynchronous launches overlap the device, so a layer or an optimizer step takes the longer
of its device time and its ops' host issue time; and how calibrate measures that host time."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan import catalog
from meshplan.calibrate.local import LAUNCH_BOUND, fit_host_op, gemm_rows
from meshplan.cost.calib import Calibration
from meshplan.cost.compute import host_bound
from meshplan.cost.dp import ADAM_OPS_PER_TENSOR, optimizer_time
from meshplan.cost.estimate import estimate
from meshplan.spec.plan import Plan


def test_host_bound_by_hand():
    calib = Calibration(host_op_s=10e-6)
    # 100 ops: 1 ms forward, 1.5 ms backward-input, 0.5 ms backward-weight of host time.
    assert host_bound((2e-3, 1e-3, 1e-4), 100, calib) == pytest.approx((2e-3, 1.5e-3, 0.5e-3))
    assert host_bound((2e-3, 1e-3, 1e-4), 100, Calibration()) == (2e-3, 1e-3, 1e-4)  # not modelled: unchanged


def test_optimizer_is_the_slower_of_memory_and_host():
    plan = Plan(global_batch=8, seq_len=128, micro_batch=1)
    mem = 30.0 * 1e6 / (1e12 * 1.0)  # 30 bytes per parameter (Adam, multi-tensor) over 1 TB/s
    assert optimizer_time(1e6, 0.0, plan=plan, hbm_bandwidth=1e12, mem_eff=1.0) == pytest.approx(mem)
    host = 50 * ADAM_OPS_PER_TENSOR * 1e-6
    assert optimizer_time(1e6, 0.0, plan=plan, hbm_bandwidth=1e12, mem_eff=1.0, n_tensors=50,
                          host_floor_s=1e-6) == pytest.approx(max(mem, host))


def test_more_host_time_is_never_faster():
    model, plan = catalog.model("small-llama"), Plan(global_batch=8, seq_len=128, micro_batch=1,
                                                     precision="bf16", fused_kernels=False)
    gpu = catalog.gpu("h200")
    times = []
    for h in (0.0, 1e-6, 1e-5, 1e-4):
        g = replace(gpu, calibration=(("host_op_s", h),))
        times.append(estimate(model, _one(g), plan).step_time)
    assert times == sorted(times) and times[-1] > 10 * times[0]


def _one(gpu):
    from meshplan.spec.cluster import ClusterSpec, Pool

    return ClusterSpec(pools=(Pool(gpu=gpu, n_gpus=1, gpus_per_node=1),))


def test_fit_host_op_inverts_the_model():
    gpu = catalog.gpu("h200")
    step = {"model": "small-llama", "plan": {"global_batch": 8, "seq_len": 128, "micro_batch": 1,
                                             "precision": "bf16", "fused_kernels": False}}
    truth = replace(gpu, calibration=(("host_op_s", 37e-6),))
    plan = Plan(global_batch=8, seq_len=128, micro_batch=1, precision="bf16", fused_kernels=False)
    measured = estimate(catalog.model("small-llama"), _one(truth), plan).step_time
    assert fit_host_op({**step, "s": measured}, gpu) == pytest.approx(37e-6, rel=1e-3)
    assert fit_host_op({**step, "s": 1e-9}, gpu) == 0.0  # already slower than measured: no host term


def test_launch_bound_gemms_are_left_out_on_a_gpu():
    rows = [[512, 512, 512, 20e-6], [4096, 4096, 4096, 195e-6], [8192, 8192, 8192, 1.5e-3],
            [8192, 2048, 8192, 4e-4]]
    gpu = {"device": "cuda", "op_overhead_s": 14e-6, "gemm": rows}
    assert gemm_rows(gpu) == [r for r in rows if r[3] >= LAUNCH_BOUND * 14e-6] == rows[1:]
    assert gemm_rows({**gpu, "device": "cpu"}) == rows


def test_fit_sync_inverts_the_model():
    # The CPU probe: a TP+SP step over 2 processes whose excess over compute is the per-call synchronisation.
    from meshplan.calibrate.local import fit_sync
    from meshplan.spec.cluster import ClusterSpec, Pool

    cpu = catalog.gpu("cpu")
    plan_d = {"global_batch": 4, "seq_len": 192, "micro_batch": 2, "precision": "fp32", "sp": True, "tp": 2}
    truth = replace(cpu, calibration=(("sync_s", 2.5e-3),))
    plan = Plan(**plan_d)
    measured = estimate(catalog.model("probe-llama"), ClusterSpec(pools=(Pool(gpu=truth, n_gpus=2, gpus_per_node=2),)),
                        plan).step_time
    step = {"model": "probe-llama", "plan": plan_d, "s": measured}
    assert fit_sync(step, cpu) == pytest.approx(2.5e-3, rel=1e-3)
