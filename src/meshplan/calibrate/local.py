"""Fit local micro-benchmark timings (``meshplan.runtime.bench``) into a hardware profile in the catalog's format.

The fit reuses the cost model's own forms, no second model:

* GEMMs: ``rate = peak * gemm_eff * prod_d d / (d + n_half)`` (``meshplan.cost.compute.shape_eff``); least
  squares in log space over the measured shapes gives the asymptotic rate and ``n_half``.
* Attention: the cost model charges ``flops * (1 + 2.5) / (peak * attn_eff)`` for forward + backward
  (``compute.layer_compute``), which gives ``attn_eff``.
* Memory: a copy streams ``2 * bytes`` through memory, giving the bandwidth.
* Collectives: ``t = steps(n) * latency + bus(n) * bytes / (bandwidth * eff)`` (``meshplan.cost.comm``);
  least squares over every (kind, group size, size) gives latency and bandwidth.

On a CPU there is no datasheet peak worth the name, so the measured asymptotes *are* the peaks (efficiencies
1). On a GPU the base profile's datasheet peaks stay and the measured rates become efficiencies.
"""

from __future__ import annotations

import math
from dataclasses import replace

from meshplan.cost.comm import COLLECTIVES
from meshplan.cost.compute import shape_eff
from meshplan.spec.calibration import Calibration
from meshplan.spec.hardware import GPUSpec, PeakFlops

ATTN_BWD_FACTOR = 2.5
"""Backward/forward work of the attention core, as ``meshplan.cost.compute.layer_compute`` charges it."""


def fit_gemm_curve(rows: list[list[float]]) -> tuple[float, float]:
    """(asymptotic FLOP/s, n_half) minimizing the squared log error of ``rate = A * prod d/(d+n_half)`` over
    [m, n, k, seconds] rows. For a given n_half the best log A is the mean log residual (closed form); n_half
    is scanned on a log grid from 1 to 4096.

    Example: rows measured at exactly A=1e11, n_half=64 give back (1e11, 64) within the grid step.
    """
    best = (math.inf, 0.0, 0.0)
    for i in range(0, 241):
        n_half = 2 ** (i / 20)
        calib = Calibration(n_half=n_half)
        logs = [math.log(2 * m * n * k / s) - math.log(shape_eff(m, n, k, calib)) for m, n, k, s in rows]
        log_a = sum(logs) / len(logs)
        err = sum((x - log_a) ** 2 for x in logs)
        if err < best[0]:
            best = (err, math.exp(log_a), n_half)
    return best[1], best[2]


def attention_flops(shape: list[int]) -> float:
    """Causal attention-core forward FLOPs of [batch, heads, seq, head_dim] as ``cost.ops`` counts them:
    QK^T and AV at 2 FLOP per multiply-add, halved by causal block skipping."""
    b, h, n, d = shape
    return 2.0 * b * n * n * h * (d + d) / 2


def fit_link(rows: list[tuple[str, int, float, float]]) -> tuple[float, float]:
    """(latency s, bandwidth bytes/s) of ``t = steps(n) latency + bus(n) bytes / bandwidth`` by least squares
    over (kind, group size, bytes, seconds) rows, both kept positive. Solves the 2x2 normal equations in
    (latency, 1/bandwidth); a negative latency is clamped to 0 and the bandwidth refitted."""
    xs = [(COLLECTIVES[k].steps(n), COLLECTIVES[k].bus_factor(n) * b, t) for k, n, b, t in rows]
    saa = sum(a * a for a, _, _ in xs)
    sab = sum(a * c for a, c, _ in xs)
    sbb = sum(c * c for _, c, _ in xs)
    sat = sum(a * t for a, _, t in xs)
    sbt = sum(c * t for _, c, t in xs)
    det = saa * sbb - sab * sab
    lat, inv_bw = ((sat * sbb - sab * sbt) / det, (saa * sbt - sab * sat) / det) if det else (0.0, 0.0)
    if lat < 0 or not det:
        lat, inv_bw = 0.0, sbt / sbb
    if inv_bw <= 0:
        inv_bw = 1e-12
        lat = sat / saa
    return lat, 1.0 / inv_bw


def collective_rows(bench: dict) -> list[tuple[str, int, float, float]]:
    """(kind, group size, bytes, seconds) from the benchmark's ``collectives`` table."""
    out = []
    for kind, by_size in bench.get("collectives", {}).items():
        for size, pairs in by_size.items():
            out += [(kind, int(size), float(b), float(t)) for b, t in pairs]
    return out


LAUNCH_BOUND = 10.0
"""A GPU GEMM timed within this many launch latencies (``op_overhead_s``: one tiny op plus its synchronisation)
measures the launch, not the matrix units: such rows are left out of the curve fit on a GPU."""


def gemm_rows(bench: dict) -> list[list[float]]:
    """The GEMM rows the curve is fitted on: all of them on a CPU, those well above launch latency on a GPU."""
    rows = bench["gemm"]
    if bench.get("device") != "cuda":
        return rows
    kept = [r for r in rows if r[3] >= LAUNCH_BOUND * float(bench["op_overhead_s"])]
    return kept if len(kept) >= 3 else rows


def fit_host_op(step: dict, gpu: GPUSpec) -> float:
    """``host_op_s`` at which the cost model's step time of the measured tiny training step equals the
    measurement (``runtime.bench.bench_host_step``: a model so small the device idles, so the step is the host
    issuing its ops); 0 when the model already predicts the measured time without any host term."""
    return invert_step(step, gpu, "host_op_s", n_gpus=1)


def fit_sync(step: dict, gpu: GPUSpec) -> float:
    """``sync_s`` at which the cost model's time of the measured TP+SP step (``runtime.bench.bench_sync_step``)
    equals the measurement: the model's own count of blocking calls turns the step's excess into a per-call
    cost."""
    plan = step["plan"]
    return invert_step(step, gpu, "sync_s", n_gpus=int(plan["tp"]) * int(plan.get("dp", 1)))


def invert_step(step: dict, gpu: GPUSpec, field: str, *, n_gpus: int) -> float:
    """The value of calibration constant ``field`` at which the cost model's step time of ``step`` (model, plan,
    measured seconds ``s``) on ``n_gpus`` of ``gpu`` equals the measurement. Step time never falls as a
    host-side cost grows, so bisection finds it; 0 when the model is already as slow as measured."""
    from meshplan import catalog
    from meshplan.cost.estimate import estimate
    from meshplan.spec.cluster import ClusterSpec, Pool
    from meshplan.spec.plan_file import plan_from_dict

    model, plan, measured = catalog.model(step["model"]), plan_from_dict(step["plan"]), float(step["s"])
    stack = catalog.framework_with(plan.framework, step.get("framework"))
    base = dict(gpu.calibration)

    def predicted(x: float) -> float:
        g = replace(gpu, calibration=tuple(sorted({**base, field: x}.items())))
        pool = Pool(gpu=g, n_gpus=n_gpus, gpus_per_node=n_gpus)
        return estimate(model, ClusterSpec(pools=(pool,)), plan, stack=stack).step_time

    if predicted(0.0) >= measured:
        return 0.0
    lo, hi = 0.0, 1e-4
    while predicted(hi) < measured and hi < 1.0:
        lo, hi = hi, 2 * hi
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if predicted(mid) < measured else (lo, mid)
    return 0.5 * (lo + hi)


def fit_profile(bench: dict, *, base: GPUSpec, name: str) -> GPUSpec:
    """The base profile with measured peaks, bandwidths, latency and calibration constants.

    Args:
        bench: raw timings written by ``meshplan.runtime.bench``.
        base: the profile to start from (``cpu`` on a CPU, the datasheet entry of the GPU otherwise).
        name: name of the new profile.
    """
    dtype = bench["dtype"]
    rate, n_half = fit_gemm_curve(gemm_rows(bench))
    datasheet = base.generation != "cpu" and base.peak_flops(dtype) > 0
    peak = base.peak_flops(dtype) if datasheet else rate
    att = bench["attention"]
    attn_rate = attention_flops(att["shape"]) * (1 + ATTN_BWD_FACTOR) / att["fwd_bwd_s"]
    copy_bw = 2.0 * bench["copy"]["bytes"] / bench["copy"]["s"]
    hbm = base.hbm_bandwidth if datasheet else copy_bw
    calib = {"gemm_eff": rate / peak, "n_half": n_half, "attn_eff": attn_rate / peak, "mem_eff": copy_bw / hbm,
             "launch_s": float(bench["op_overhead_s"])}
    if base.generation == "cpu":
        # A CPU runs each op's dispatch before its work, so the overhead adds to every op instead of hiding
        # behind asynchronous launches as on a GPU.
        calib["op_overhead_s"] = float(bench["op_overhead_s"])
        calib["dtensor_overhead_s"] = float(bench.get("dtensor_overhead_s", 0.0))
        calib["sync_s"] = float(bench.get("sync_s", 0.0))  # raw files from before the probe step
    changes: dict = {"name": name, "hbm_bandwidth": hbm,
                     "source": f"meshplan calibrate on {bench['device_name']} ({bench['world']} processes, "
                               f"{bench['threads']} threads each, {dtype})"}
    if not datasheet:
        changes["peak"] = PeakFlops(**{dtype: peak})
        changes["hbm_bytes"] = float(bench["memory_bytes"])
    rows = collective_rows(bench)
    if rows:
        lat, bw = fit_link(rows)
        changes["intra_latency"] = lat
        if datasheet:
            calib["intra_eff"] = bw / base.intra_bandwidth
        else:
            changes["intra_bandwidth"] = bw
            calib["intra_eff"] = 1.0
        changes["nvlink_domain"] = max(base.nvlink_domain, bench["world"])
    changes["calibration"] = tuple(sorted((k, _round(v)) for k, v in calib.items()))
    gpu = replace(base, **changes)
    if datasheet and bench.get("host_step"):
        calib["host_op_s"] = fit_host_op(bench["host_step"], gpu)
    elif not datasheet and bench.get("sync_step"):
        calib["sync_s"] = fit_sync(bench["sync_step"], gpu)
    return replace(gpu, calibration=tuple(sorted((k, _round(v)) for k, v in calib.items())))


def _round(x: float) -> float:
    """Four significant digits: enough for the model, readable in the file."""
    return float(f"{x:.4g}")
