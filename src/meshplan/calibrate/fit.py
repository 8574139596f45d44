"""Fit the few calibration constants per hardware generation from published runs.

Objective per section: mean |log(predicted / measured)| over its runs plus a prior that pulls each constant
toward its documented default (``prior`` x squared log ratio), so a section with few runs stays near physics.
Coordinate descent with golden-section search in log space; deterministic.
"""

from __future__ import annotations

import math
from dataclasses import fields
from pathlib import Path

from meshplan.calibrate.runs import Run
from meshplan.cost.estimate import estimate
from meshplan.spec.calibration import Calibration

FIT_FIELDS = ("gemm_eff", "fp8_eff", "attn_eff")
BOUNDS = {"gemm_eff": (0.2, 0.95), "fp8_eff": (0.15, 0.95), "attn_eff": (0.1, 0.9), "moe_eff": (0.2, 1.0)}
SHARED_FIELDS = ("moe_eff",)
# The one part whose peak is not documented (a 500 W power-capped H100 with HBM2e; the dataset README gives
# only a range), so it gets its own section instead of sharing Hopper's.
PART_SECTIONS = ("h100-hbm2e-96gb",)


def section_of(run: Run) -> str:
    """Calibration section of a run: its GPU part when listed in PART_SECTIONS, else its generation."""
    gpu = run.cluster.gpu
    return gpu.name if gpu.name in PART_SECTIONS else gpu.generation


def log_error(runs: list[Run], table: dict) -> float:
    """Mean |log(pred/measured)| of ``runs`` under calibration ``table``."""
    total = 0.0
    for r in runs:
        pred = estimate(r.model, r.cluster, r.plan, stack=r.framework, calib=table).step_time
        total += abs(math.log(pred / r.measured_s))
    return total / max(len(runs), 1)


def _golden(f, lo: float, hi: float, iters: int = 14) -> float:
    """Minimize a unimodal f on [lo, hi] in log space."""
    a, b = math.log(lo), math.log(hi)
    g = (math.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(math.exp(c)), f(math.exp(d))
    for _ in range(iters):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(math.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(math.exp(d))
    return math.exp((a + b) / 2)


def fit_section(runs: list[Run], name: str, table: dict, *, prior: float, rounds: int = 2,
                fit_fields: tuple[str, ...] = FIT_FIELDS, parent: str = "") -> dict[str, float]:
    """Fit ``fit_fields`` of one section; fields a section's runs cannot inform (fp8 without fp8 runs) stay.
    The prior pulls toward the documented defaults, or for a part section toward its generation's values."""
    defaults = Calibration(**{**table.get("default", {}), **table.get(parent, {})}) if parent else Calibration()
    values = dict(table.get(name, {}))
    has_fp8 = any(r.plan.precision == "fp8" for r in runs)
    for _ in range(rounds):
        for fld in fit_fields:
            if fld == "fp8_eff" and not has_fp8:
                continue
            base = getattr(defaults, fld)

            def objective(x: float, fld=fld, base=base) -> float:
                trial = {**table, name: {**values, fld: x}}
                return log_error(runs, trial) + prior * math.log(x / base) ** 2

            values[fld] = round(_golden(objective, *BOUNDS[fld]), 4)
    return values


def fit(runs: list[Run], *, prior: float = 0.02) -> dict[str, dict[str, float]]:
    """Fitted table ``{section: {constant: value}}`` for every section that has runs."""
    sections: dict[str, list[Run]] = {}
    for r in runs:
        sections.setdefault(section_of(r), []).append(r)
    table: dict[str, dict[str, float]] = {}
    moe_runs = [r for r in runs if r.model.is_moe]
    # Generations first; then each distinct part, pulled toward its generation (it is the same silicon).
    parents = {section_of(r): r.cluster.gpu.generation for r in runs if section_of(r) in PART_SECTIONS}
    order = sorted(n for n in sections if n not in parents) + sorted(parents)
    for _ in range(2):
        for name in order:
            table[name] = fit_section(sections[name], name, table, prior=prior, parent=parents.get(name, ""))
        if moe_runs:
            # One constant for all generations, informed by the MoE runs only (too few to split).
            table["default"] = fit_section(moe_runs, "default", table, prior=prior, fit_fields=SHARED_FIELDS)
    return dict(sorted(table.items()))


def write_table(table: dict[str, dict[str, float]], path: str | Path, *, source: str) -> None:
    """Write the fitted constants as TOML with a provenance header."""
    import tomli_w

    known = {f.name for f in fields(Calibration)}
    assert all(set(v) <= known for v in table.values())
    header = (f"# Fitted by `python scripts/fit_calibration.py` from {source}.\n"
              "# Do not edit by hand: rerun the script. Fields not listed keep the documented defaults in\n"
              "# meshplan/cost/calib.py.\n")
    Path(path).write_text(header + tomli_w.dumps(table))
