"""The GPU host floor: asynchronous launches overlap the device, so a layer or an optimizer step takes the longer
of its device time and its ops' host issue time; and how calibrate measures that host time."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan import catalog
from meshplan.calibrate.local import LAUNCH_BOUND, fit_host_op, gemm_rows
from meshplan.cost.calib import calibration_for
from meshplan.cost.compute import host_excess
from meshplan.cost.dp import ADAM_OPS_PER_TENSOR, fused_adam_launches, optimizer_time
from meshplan.cost.estimate import estimate
from meshplan.cost.ops import layer_ops
from meshplan.spec.calibration import Calibration
from meshplan.spec.plan import Plan


def test_host_excess_by_hand():
    calib = Calibration(host_op_s=10e-6)
    # 100 ops: 1 ms of forward host time, 2 ms of backward (twice the ops), against the device's time
    # (compute plus exposed communication): the layer waits only for the excess.
    assert host_excess(0.4e-3, 2.5e-3, 100, calib) == pytest.approx((0.6e-3, 0.0))
    assert host_excess(2e-3, 1e-3, 100, calib) == pytest.approx((0.0, 1e-3))
    assert host_excess(0.0, 0.0, 100, calib, replayed=100) == pytest.approx((1e-3, 3e-3))  # full recompute
    assert host_excess(0.0, 0.0, 100, Calibration(host_op_s=0.0)) == (0.0, 0.0)  # not modelled


def test_cpu_has_no_host_floor_and_gpus_do():
    assert calibration_for("cpu", "cpu").host_op_s == 0.0
    assert calibration_for("cpu", "cpu", measured=(("sync_s", 1e-3),)).host_op_s == 0.0
    assert calibration_for("b200", "blackwell").host_op_s == pytest.approx(6.123e-5)


def test_fp8_counts_a_host_op_per_expert_weight():
    # DeepSeek-V3's MoE layer with 32 local experts: under fp8 every expert GEMM copy also fetches its fp8 weight.
    model = catalog.model("deepseek-v3")
    layer = model.blocks[-1].layer
    bf16 = Plan(global_batch=8, seq_len=4096, ep=8, dp=8)
    fp8 = bf16.with_(precision="fp8")
    te = catalog.framework("megatron-bridge")
    n16 = layer_ops(layer, tokens=4096, plan=bf16, stack=te).n_ops
    n8 = layer_ops(layer, tokens=4096, plan=fp8, stack=te).n_ops
    linear = sum(g.count for g in layer_ops(layer, tokens=4096, plan=fp8, stack=te).gemms if g.linear)
    assert n8 - n16 == linear >= 2 * 32


def test_fused_optimizer_launches_by_hand():
    # apex multi_tensor_apply: 36 tensors per launch, 320 chunks of 65536 elements; three ops per step.
    assert fused_adam_launches(72, 1e6) == 3 * 2
    assert fused_adam_launches(10, 320 * 65536 * 5) == 3 * 5
    plan, fused = Plan(global_batch=8, seq_len=128), catalog.framework("megatron-core")
    kw = dict(plan=plan, stack=fused, hbm_bandwidth=1e15, mem_eff=1.0, n_tensors=72, host_floor_s=1e-6)
    assert optimizer_time(1e6, 0.0, **kw) == pytest.approx(6e-6)
    assert optimizer_time(1e6, 0.0, **{**kw, "stack": fused.with_(fused_optimizer=False)}) == \
        pytest.approx(72 * ADAM_OPS_PER_TENSOR * 1e-6)


def test_optimizer_is_the_slower_of_memory_and_host():
    plan = Plan(global_batch=8, seq_len=128, micro_batch=1)
    loop = catalog.framework("megatron-core").with_(fused_optimizer=False)
    mem = 30.0 * 1e6 / (1e12 * 1.0)  # 30 bytes per parameter (Adam, multi-tensor) over 1 TB/s
    assert optimizer_time(1e6, 0.0, plan=plan, stack=loop, hbm_bandwidth=1e12, mem_eff=1.0) == pytest.approx(mem)
    host = 50 * ADAM_OPS_PER_TENSOR * 1e-6
    assert optimizer_time(1e6, 0.0, plan=plan, stack=loop, hbm_bandwidth=1e12, mem_eff=1.0, n_tensors=50,
                          host_floor_s=1e-6) == pytest.approx(max(mem, host))


def test_more_host_time_is_never_faster():
    model, plan = catalog.model("small-llama"), Plan(global_batch=8, seq_len=128, micro_batch=1,
                                                     precision="bf16", framework="meshplan")
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
                                             "precision": "bf16", "framework": "meshplan"},
            "framework": {"fused_optimizer": False}}
    truth = replace(gpu, calibration=(("host_op_s", 37e-6),))
    plan = Plan(global_batch=8, seq_len=128, micro_batch=1, precision="bf16", framework="meshplan")
    loop = catalog.framework("meshplan").with_(fused_optimizer=False)
    measured = estimate(catalog.model("small-llama"), _one(truth), plan, stack=loop).step_time
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


def test_host_wait_is_reported_inside_compute():
    # DeepSeek-V3 with 32 local experts per GPU in fp8: the host paces the MoE layers; with 4 it does not.
    from meshplan.spec.cluster import ClusterSpec, Pool

    model = catalog.model("deepseek-v3")
    cluster = ClusterSpec(pools=(Pool(gpu=catalog.gpu("b200"), n_gpus=256, gpus_per_node=256),))
    plan = Plan(global_batch=256, seq_len=4096, pp=16, dp=16, zero=1, precision="fp8")
    many = estimate(model, cluster, plan.with_(ep=8)).time
    few = estimate(model, cluster, plan.with_(ep=16, precision="bf16")).time
    assert 0.2 * many.compute < many.host_wait < many.compute
    assert many.total() == pytest.approx(sum(v for k, v in many.as_dict().items()
                                              if k not in ("recompute", "host_wait")))
    assert few.host_wait < 0.05 * few.compute
