"""Compute time of ops: a roofline with a shape-dependent efficiency per GPU generation."""

from __future__ import annotations

from dataclasses import replace

from meshplan.cost.ops import Gemm, LayerOps
from meshplan.spec.calibration import Calibration
from meshplan.spec.hardware import DTYPE_BYTES, GPUSpec


def shape_eff(m: float, n: float, k: float, calib: Calibration, *, rate: float = 1.0,
              few_rows: bool = False) -> float:
    """Efficiency loss of small GEMMs: each dim d contributes d / (d + n_half) (tile quantization and
    pipeline fill; a saturating fit to cuBLAS shape sweeps). Large dims give 1. A low-precision tile's main loop
    runs ``rate`` times the 16-bit speed (2 for fp8, 4 for fp4) while its prologue, epilogue and wave tail take
    the same time, so the fixed part weighs ``rate`` times: fp8's efficiency halves at 2 n_half. ``few_rows``: a
    serving engine's kernels, whose few token rows ride the narrow side of a swapped tile (``swapped_rows``)."""
    half = calib.n_half * rate
    e = max(m / (m + half), m / swapped_rows(m)) if few_rows and m <= SWAP_AB_ROWS else m / (m + half)
    for d in (n, k):
        e *= d / (d + half)
    return e


SWAP_AB_ROWS = 64
"""Token rows up to which an inference GEMM swaps its operands so the tokens ride the tile's narrow side (vllm
csrc/quantization/cutlass_w8a8/c3x/scaled_mm_sm90_fp8_dispatch.cuh: 'enable swap AB for M < 64', tiles 64x16
for M <= 16, 64x32 and 64x64 above)."""


def swapped_rows(m: float) -> int:
    """Rows ``m`` tokens pad to on the narrow side of a swapped tile: 16, 32 or 64."""
    return 16 if m <= 16 else 32 if m <= 32 else 64


LOW_PRECISION = {"fp8": ("fp8", 2.0), "fp4": ("fp4", 4.0), "int4": ("bf16", 1.0)}
"""Weight formats whose linear GEMMs run on another path: (the MMA dtype, its main loop's speed-up over 16
bits). fp8 / fp4 recipes quantize weights and activations (TE, ModelOpt); int4 is weight-only, dequantized into
16-bit MMAs (Marlin, AWQ kernels). Other GEMMs (attention BMMs) stay 16-bit."""


def gemm_time(g: Gemm, *, gpu: GPUSpec, calib: Calibration, dtype: str, few_rows: bool = False) -> float:
    """Seconds for one GEMM (all copies): max of compute roofline and memory roofline (Williams et al. 2009),
    and at least one kernel launch per copy. A low-precision format applies to weight GEMMs only; int4's
    weights are read at its packed width, its activations at 16 bits."""
    use, rate = dtype, 1.0
    if dtype in LOW_PRECISION:
        use, rate = LOW_PRECISION[dtype] if g.linear else ("bf16", 1.0)
    peak = gpu.peak_flops(use)
    eff = (calib.fp8_eff if rate > 1 else calib.gemm_eff) * shape_eff(g.m, g.n, g.k, calib, rate=rate,
                                                                       few_rows=few_rows)
    if g.grouped:
        eff *= calib.moe_eff
    t_compute = g.flops / (peak * eff)
    b = DTYPE_BYTES[use]
    w = DTYPE_BYTES[dtype] if dtype == "int4" and g.linear else b
    t_memory = g.count * (b * (g.m * g.k + g.m * g.n) + w * g.k * g.n) / (gpu.hbm_bandwidth * calib.mem_eff)
    t = max(t_compute, t_memory, (g.launches or g.count) * calib.launch_s)
    if use == "fp8" and g.cast_pass:
        # An unfused fp8 GEMM first casts its 16-bit left operand to fp8 (read 2 bytes, write 1; torchao's
        # dynamic scaling in eager mode), a memory-bound pass.
        t += g.count * 3.0 * g.m * g.k / (gpu.hbm_bandwidth * calib.mem_eff)
    return t


def attention_time(flops: float, *, gpu: GPUSpec, calib: Calibration, dtype: str) -> float:
    """Seconds for the attention core (flash attention stays in bf16/fp16 under fp8 training)."""
    if flops <= 0:
        return 0.0
    use = "bf16" if dtype in LOW_PRECISION else dtype
    return max(flops / (gpu.peak_flops(use) * calib.attn_eff), calib.launch_s)


def memory_time(nbytes: float, *, gpu: GPUSpec, calib: Calibration) -> float:
    """Seconds to stream ``nbytes`` through HBM at the achievable bandwidth."""
    return nbytes / (gpu.hbm_bandwidth * calib.mem_eff)


def layer_compute(ops: LayerOps, *, gpu: GPUSpec, calib: Calibration, dtype: str,
                  sharded: bool = False) -> tuple[float, float, float]:
    """(forward, backward-input, backward-weight) compute seconds of one layer on one rank.

    Backward GEMMs: input and weight gradients, each of the forward's FLOPs (Narayanan et al. 2021, sec. 3.2).
    Flash-attention backward does 2.5x the forward's matmul work (Dao 2023, sec. 3.1: 5 GEMMs vs 2) and is
    all input-gradient. ``sharded``: the layer's tensors are DTensors (tensor parallel), whose ops pay extra
    host dispatch. Elementwise backward moves about twice the forward bytes (reads saved inputs and
    output gradients, writes input gradients).
    """
    fwd = bi = bw = 0.0
    for g in ops.gemms:
        fwd += gemm_time(g, gpu=gpu, calib=calib, dtype=dtype)
        bi += gemm_time(replace(g, n=g.k, k=g.n), gpu=gpu, calib=calib, dtype=dtype)
        bw += gemm_time(replace(g, m=g.k, k=g.m), gpu=gpu, calib=calib, dtype=dtype)
    ew = memory_time(ops.elementwise_bytes, gpu=gpu, calib=calib)
    if ops.score_bytes:
        # Unfused attention: QK^T and AV are batched GEMMs, the score matrix streams through HBM; the
        # backward does twice the GEMM work and twice the traffic (scores are stored, not recomputed).
        use = "bf16" if dtype == "fp8" else dtype
        att = ops.attn_flops / (gpu.peak_flops(use) * calib.gemm_eff) + memory_time(ops.score_bytes, gpu=gpu,
                                                                                     calib=calib)
        att_bwd = 2.0
    else:
        att, att_bwd = attention_time(ops.attn_flops, gpu=gpu, calib=calib, dtype=dtype), 2.5
    # Host overhead that does not overlap (CPUs): every forward op once, the backward about twice as many.
    host = ops.n_ops * (calib.op_overhead_s + (calib.dtensor_overhead_s if sharded else 0.0))
    return fwd + att + ew + host, bi + att_bwd * att + 2 * ew + 1.5 * host, bw + 0.5 * host


def host_excess(device_f: float, device_b: float, n_ops: int, calib: Calibration, *,
                replayed: int = 0) -> tuple[float, float]:
    """(forward, backward) seconds a layer waits on the host on a GPU: launches are asynchronous, so the host
    issues a layer's ops while the device computes or waits on its exposed communication, and the layer takes
    the longer of the two (``host_op_s`` per op; the backward issues twice the forward's ops, plus the
    ``replayed`` ops of a recompute). 0 when the host keeps ahead, or is not modelled."""
    if not calib.host_op_s:
        return 0.0, 0.0
    h = n_ops * calib.host_op_s
    return max(h - device_f, 0.0), max((2 * n_ops + replayed) * calib.host_op_s - device_b, 0.0)
