"""Calibration constants: few, per hardware generation, documented, fitted by ``meshplan.calibrate.fit``.

Defaults come from public micro-benchmarks (cited per field); ``calibrate/constants.toml`` holds the values
the fit script wrote from the visible published runs. Nothing here is edited by hand to pass a row.
"""

from __future__ import annotations

import csv
import tomllib
from dataclasses import fields
from functools import lru_cache
from importlib import resources

from meshplan.errors import SpecError
from meshplan.spec.calibration import Calibration
from meshplan.spec.hardware import GPUSpec

# Physical defaults of a generation that differ from the field defaults: a CPU issues nothing ahead of its work
# (its dispatch is op_overhead_s, paid before each op), so it has no host floor.
GENERATION_DEFAULTS = {"cpu": {"host_op_s": 0.0}}

FITTED_FIELDS = ("gemm_eff", "fp8_eff", "attn_eff", "moe_eff")

FA2_OVER_CUDNN = {"hopper": 0.62}
"""Attention throughput of FlashAttention-2 (torch SDPA's flash backend, the flash-attn package: what the
``pytorch`` kernel library runs) against cuDNN's fused attention (Transformer Engine, the ``nvidia`` library the
generation's constants are fitted on): 370 vs 595 TFLOP/s forward and 322 vs 516 backward at head dim 128 and 16k
tokens on H100 SXM5 (Shah et al. 2024, FlashAttention-3, Fig. 5-6: FA2 uses none of Hopper's wgmma and TMA). On
Ampere FA2 is the fastest kernel there is; Blackwell has no published comparison, so no factor."""


_ATTN_DEFAULT = next(f.default for f in fields(Calibration) if f.name == "attn_eff")


def attention_factor(library: str, generation: str) -> float:
    """What the kernel library's attention reaches relative to the fitted (cuDNN) attention efficiency."""
    return FA2_OVER_CUDNN.get(generation, 1.0) if library == "pytorch" else 1.0


def shipped_rows(name: str) -> list[dict]:
    """The rows of a CSV a fitting script wrote into ``meshplan/calibrate`` (empty when it is not shipped)."""
    path = resources.files("meshplan.calibrate").joinpath(name)
    if not path.is_file():
        return []
    with path.open() as fh:
        return list(csv.DictReader(fh))


@lru_cache(maxsize=1)
def _fitted() -> dict[str, dict[str, float]]:
    path = resources.files("meshplan.calibrate").joinpath("constants.toml")
    if not path.is_file():
        return {}
    data = tomllib.loads(path.read_text())
    return {k: v for k, v in data.items() if isinstance(v, dict)}


def calibration_for(gpu_name: str, generation: str, table: dict[str, dict[str, float]] | None = None,
                    measured: tuple[tuple[str, float], ...] = (), *, library: str = "") -> Calibration:
    """The calibration of a GPU running a kernel library: field defaults and its generation's physical defaults,
    overridden by the fitted table's ``default`` section, then its generation's section, then that section's
    sub-table for the stack's kernel library (``[hopper.pytorch]``: the constants where ATen and torch SDPA reach
    other efficiencies than NVIDIA's kernels), then a section for this GPU model (a distinct part), then constants
    measured on the device itself (``meshplan calibrate``). The table's attention efficiency is cuDNN's; a library
    with a slower attention kernel scales it (``attention_factor``)."""
    table = _fitted() if table is None else table
    gen = table.get(generation, {})
    lib = gen.get(library, {}) if library else {}
    values = {**GENERATION_DEFAULTS.get(generation, {}), **table.get("default", {}),
              **{k: v for k, v in gen.items() if not isinstance(v, dict)}, **(lib if isinstance(lib, dict) else {}),
              **table.get(gpu_name, {})}
    factor = 1.0 if isinstance(lib, dict) and "attn_eff" in lib else attention_factor(library, generation)
    if factor != 1.0:  # a fitted library sub-table, or constants measured on the device, ran the kernel itself
        values["attn_eff"] = values.get("attn_eff", _ATTN_DEFAULT) * factor
    values.update(dict(measured))
    known = {f.name for f in fields(Calibration)}
    bad = set(values) - known
    if bad:
        raise SpecError("calibration", sorted(bad), f"unknown constants; known: {', '.join(sorted(known))}")
    return Calibration(**values)


def gpu_calibration(gpu: GPUSpec, table: dict | None = None, *, library: str = "") -> Calibration:
    """``calibration_for`` of a catalog or calibrated GPU (its own measured constants included)."""
    return calibration_for(gpu.name, gpu.generation, table, gpu.calibration, library=library)
