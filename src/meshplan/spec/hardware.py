"""Hardware spec: one accelerator type, as its datasheet describes it."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from numbers import Integral

from meshplan.errors import SpecError

DTYPE_BYTES = {"fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp4": 0.5625, "int4": 0.51953125}
"""Bytes of one element of each number format the GPUs' peaks are given for (IEEE 754 / OCP FP8; NVFP4: a 4-bit
E2M1 value plus one E4M3 scale per 16 elements, NVIDIA's "Introducing NVFP4" (2025), 4.5 bits), and of int4
weight-only weights (AWQ / GPTQ packing: eight 4-bit weights per int32, per group of 128 one fp16 scale and one
packed 4-bit zero, 4 + 20/128 bits; AutoAWQ WQLinear, GPTQ QuantLinear)."""

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4")
GENERATIONS = ("volta", "ampere", "ada", "hopper", "blackwell", "cdna2", "cdna3", "cdna4", "gaudi", "tpu", "cpu")
GB = 1e9
GiB = 2**30


@dataclass(frozen=True, kw_only=True)
class PeakFlops:
    """Dense peak throughput per dtype (FLOP/s); 0 means the dtype has no fast path on this device."""

    fp32: float = 0.0
    """FP32 (non-tensor-core) FLOP/s."""
    tf32: float = 0.0
    """TF32 tensor-core FLOP/s."""
    bf16: float = 0.0
    """BF16 tensor-core FLOP/s."""
    fp16: float = 0.0
    """FP16 tensor-core FLOP/s."""
    fp8: float = 0.0
    """FP8 tensor-core FLOP/s."""
    fp4: float = 0.0
    """FP4 (NVFP4) tensor-core FLOP/s (Blackwell); no fallback: a device without it cannot run FP4 GEMMs."""

    def get(self, dtype: str) -> float:
        """Peak for ``dtype``, falling back to the next wider type the hardware runs (fp8 -> bf16, ...)."""
        # No fp16 <-> bf16 substitution: a device without bf16 tensor cores (V100) runs bf16 at fp32 speed.
        order = {"fp4": ("fp4",), "fp8": ("fp8", "bf16", "fp16", "fp32"), "bf16": ("bf16", "fp32"),
                 "fp16": ("fp16", "fp32"), "tf32": ("tf32", "fp32"), "fp32": ("fp32",)}
        for d in order[dtype]:
            v = getattr(self, d)
            if v > 0:
                return v
        return 0.0


@dataclass(frozen=True, kw_only=True)
class GPUSpec:
    """One accelerator type (GPU, TPU chip, or CPU process), as its datasheet describes it."""

    name: str
    """Catalog key, e.g. ``h100-sxm``."""
    generation: str
    """Architecture generation; calibration constants are keyed by it."""
    peak: PeakFlops
    """Dense peak FLOP/s per dtype."""
    hbm_bytes: float
    """Usable device memory (bytes)."""
    hbm_bandwidth: float
    """Device memory bandwidth (bytes/s)."""
    intra_bandwidth: float
    """Per-GPU unidirectional scale-up bandwidth, e.g. NVLink (bytes/s): half the datasheet's bidirectional."""
    nic_bandwidth: float
    """Per-GPU unidirectional scale-out bandwidth (bytes/s)."""
    nvlink_domain: int = 8
    """GPUs sharing one scale-up domain in the reference system (8 for HGX, 72 for NVL72)."""
    gpus_per_node: int = 8
    """GPUs per host in the reference system."""
    intra_latency: float = 3e-6
    """Scale-up per-hop latency (s)."""
    nic_latency: float = 8e-6
    """Scale-out per-hop latency (s)."""
    price_per_hour: float = 0.0
    """Price per GPU-hour (any currency; 0 = unknown) for cost objectives."""
    source: str = ""
    """Where the figures come from."""
    calibration: tuple[tuple[str, float], ...] = ()
    """Calibration constants measured on this very device (``meshplan calibrate``); they override the
    generation's fitted values."""

    def __post_init__(self) -> None:
        if self.generation not in GENERATIONS:
            raise SpecError(f"gpu[{self.name}].generation", self.generation,
                            f"must be one of {', '.join(GENERATIONS)}")
        for f in ("hbm_bytes", "hbm_bandwidth", "intra_bandwidth", "nic_bandwidth"):
            if not (math.isfinite(getattr(self, f)) and getattr(self, f) > 0):  # NaN > 0 is False
                raise SpecError(f"gpu[{self.name}].{f}", getattr(self, f), "must be positive and finite")
        for f in ("intra_latency", "nic_latency", "price_per_hour"):
            if not (math.isfinite(getattr(self, f)) and getattr(self, f) >= 0):
                raise SpecError(f"gpu[{self.name}].{f}", getattr(self, f), "must be >= 0 and finite")
        for f in ("nvlink_domain", "gpus_per_node"):
            if not isinstance(getattr(self, f), Integral) or isinstance(getattr(self, f), bool) or getattr(self, f) < 1:
                raise SpecError(f"gpu[{self.name}].{f}", getattr(self, f), "must be a whole number >= 1")
        bad = [f.name for f in fields(self.peak) if not (math.isfinite(getattr(self.peak, f.name))
                                                          and getattr(self.peak, f.name) >= 0)]
        if bad:
            raise SpecError(f"gpu[{self.name}].peak.{bad[0]}", getattr(self.peak, bad[0]), "must be >= 0 and finite")
        if self.peak.get("bf16") <= 0 and self.peak.get("fp32") <= 0:
            raise SpecError(f"gpu[{self.name}].peak", self.peak, "needs at least one positive peak")

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype`` (falls back to a wider dtype the device runs)."""
        return self.peak.get(dtype)
