"""The calibration spec: the few efficiency constants of one hardware generation (and software kernel library)
that the cost model's roofline and overlap terms take. ``meshplan.cost.calib`` resolves them for a GPU from the
fitted table; ``calibrate/constants.toml`` holds the values the fit script wrote."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """Efficiency constants of one hardware generation."""

    gemm_eff: float = 0.75
    """Fraction of dense peak a large bf16 GEMM reaches (cuBLAS on A100/H100 reaches 70-80%, NVIDIA
    Transformer Engine and cuBLAS benchmarks). Fitted."""
    fp8_eff: float = 0.60
    """Fraction of FP8 peak a large fp8 GEMM reaches, scaling/casts included (TE fp8 GEMM benchmarks reach
    55-70%). Fitted."""
    attn_eff: float = 0.50
    """Fraction of bf16 peak flash-attention reaches, forward and backward averaged (FlashAttention-2 reports
    50-73% fwd, 40-63% bwd on A100; FlashAttention-3 up to 75% on H100)."""
    mem_eff: float = 0.80
    """Fraction of HBM bandwidth memory-bound kernels reach (STREAM-like copies reach 80-90%)."""
    moe_eff: float = 0.7
    """Efficiency of routed-expert grouped GEMMs relative to a dense GEMM of the same shape, token
    permutation and dispatch bookkeeping included (Megatron-Core MoE reports DeepSeek-V3 at ~2/3 of dense-model
    MFU). Fitted once across generations."""
    n_half: float = 96.0
    """GEMM dimension at which efficiency halves (tile quantization and pipeline fill of small GEMMs;
    cuBLAS sweeps show ~50% at dims near one 128-wide tile)."""
    intra_eff: float = 0.80
    """Achieved bus bandwidth over scale-up links (nccl-tests: ~360 of 450 GB/s on H100 NVLink4, ~230 of 300
    on A100 NVLink3)."""
    inter_eff: float = 0.85
    """Achieved bus bandwidth over NIC rails (nccl-tests: ~42 of 50 GB/s per 400G rail)."""
    launch_s: float = 5e-6
    """Minimum duration of one kernel (launch gap, s): CUDA launch latency is 3-6 us."""
    op_overhead_s: float = 0.0
    """Host time per eager op that does not overlap device work (s): 0 on GPUs, whose launches run ahead
    asynchronously; measured by ``meshplan calibrate`` on CPUs, where dispatch precedes every op."""
    host_op_s: float = 6.123e-5
    """Host issue time per op on a GPU (Python, autograd bookkeeping, dispatch and launch) (s). Launches run
    ahead asynchronously, so the host issues a layer's ops while the device computes or waits on the layer's
    exposed communication, and the layer takes the longer of the two; an optimizer step likewise. It binds
    where the device work per op is small: little micro-batches of an eager runtime, and MoE layers with many
    local experts, whose every expert GEMM (and, under fp8, its weight cast) is an op of its own.
    Default: measured by ``meshplan calibrate`` on an H200 server, eager PyTorch (61 us;
    benchmarks/results/h200-local.toml), taken for every GPU until a device is calibrated; 0 on CPUs, where
    dispatch precedes each op (``op_overhead_s``)."""
    dtensor_overhead_s: float = 0.0
    """Extra host time per op on DTensor-sharded (tensor-parallel) layers (s): sharding propagation and
    dispatch; measured by ``meshplan calibrate`` on CPUs."""
    sync_s: float = 0.0
    """Host synchronisation per blocking collective or pipeline send between compute (s): waking the peer
    process and the backend's threads; 0 on GPUs (a stream wait, no context switch); measured by ``meshplan
    calibrate`` on CPUs from a real tensor + sequence-parallel step (``runtime.bench.bench_sync_step``),
    inverted through this model's own count of blocking calls."""
    step_overhead_s: float = 0.02
    """Fixed per-step time outside the model (optimizer bookkeeping, data loading, logging) (s): the
    tens of milliseconds between iterations that Megatron-LM's timers attribute to neither forward nor
    backward. A documented default, not fitted (it is below the noise of the published step times)."""
    overlap_eff: float = 0.85
    """Fraction of overlappable communication actually hidden (stream contention slows both; Megatron
    overlap studies report 80-90% hiding). A documented default, not fitted."""

    def with_(self, **kw) -> "Calibration":
        """A copy with some constants changed."""
        return replace(self, **kw)
