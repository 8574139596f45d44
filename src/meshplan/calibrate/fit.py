"""Fit the few calibration constants per hardware generation from published runs.

Objective per section: mean |log(predicted / measured)| over its runs plus a prior that pulls each constant
toward its documented default (``prior`` x squared log ratio), so a section with few runs stays near physics.
Coordinate descent with golden-section search in log space; deterministic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path

from meshplan.calibrate.runs import Run
from meshplan.cost.estimate import estimate
from meshplan.spec.calibration import Calibration

FIT_FIELDS = ("gemm_eff", "fp8_eff", "attn_eff")
BOUNDS = {"gemm_eff": (0.2, 0.95), "fp8_eff": (0.15, 0.95), "attn_eff": (0.1, 0.9), "moe_eff": (0.2, 1.0)}
SHARED_FIELDS = ("moe_eff",)
REFERENCE_LIBRARY = "nvidia"
"""A generation's section is fitted on its runs of NVIDIA's kernels (Megatron, Transformer Engine, cuDNN)."""
LIBRARY_FIELDS = ("attn_eff",)
"""What another kernel library would change, in a sub-table of the generation (``[hopper.pytorch]``): its attention
kernel (torch's scaled_dot_product_attention, FlashAttention-2 on Hopper, against Transformer Engine's cuDNN fused
attention); its GEMMs are cuBLAS either way. Only under the ``library`` scheme: leave-one-source-out does not
support it on the visible runs (``benchmarks/bench_cross_validation.py --compare``)."""
PART_SECTIONS = {"h100-hbm2e-96gb": ("gemm_eff", "fp8_eff")}  # plus LIBRARY_FIELDS unless the scheme is "library"
"""GPU parts whose sustained peak is not documented (Meta's Grand Teton H100 with HBM2e at a 500 W cap: the dataset
and the torchtitan benchmark document give only 'between SXM and NVL'), with the peak-bound constants fitted for
the part, pulled toward its generation's."""


@dataclass(frozen=True)
class Section:
    """A calibration section: where it lives in the table, which constants it fits, and what its prior pulls
    toward (the documented defaults, or its generation's fitted values)."""

    key: tuple[str, ...]
    fields: tuple[str, ...]
    parent: tuple[str, ...] = ()


SCHEMES = ("part", "library", "generation")
"""How runs are split into sections: ``part`` (shipped) gives a listed GPU part all three peak-bound constants;
``library`` gives a non-reference kernel library its own attention constant and the part only its GEMM ones;
``generation`` fits one section per generation. ``benchmarks/bench_cross_validation.py --compare`` scores each."""


def sections_of(run: Run, *, scheme: str = "part") -> list[Section]:
    """The sections a run's constants come from besides its generation's, under ``scheme``: its kernel library's
    sub-table and its GPU part's section. A run with none informs its generation's section."""
    if scheme not in SCHEMES:
        raise ValueError(f"calibration scheme {scheme!r}: expected one of {', '.join(SCHEMES)}")
    gen, lib, part = run.cluster.gpu.generation, run.framework.kernel_library, run.cluster.gpu.name
    out = []
    if scheme == "library" and lib != REFERENCE_LIBRARY:
        out.append(Section(key=(gen, lib), fields=LIBRARY_FIELDS, parent=(gen,)))
    if scheme != "generation" and part in PART_SECTIONS:
        fields = PART_SECTIONS[part] + (() if scheme == "library" else LIBRARY_FIELDS)
        out.append(Section(key=(part,), fields=fields, parent=(gen,)))
    return out


def _get(table: dict, key: tuple[str, ...]) -> dict:
    """The constants of section ``key`` (a generation, or its library sub-table), without sub-tables."""
    node = table
    for k in key:
        node = node.get(k, {})
    return {k: v for k, v in node.items() if not isinstance(v, dict)}


def _put(table: dict, key: tuple[str, ...], values: dict) -> dict:
    """A copy of ``table`` with section ``key`` holding ``values`` (its sub-tables kept)."""
    out = dict(table)
    if len(key) == 1:
        out[key[0]] = {**{k: v for k, v in table.get(key[0], {}).items() if isinstance(v, dict)}, **values}
        return out
    gen = dict(table.get(key[0], {}))
    gen[key[1]] = dict(values)
    out[key[0]] = gen
    return out


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


def fit_section(runs: list[Run], section: Section, table: dict, *, prior: float, rounds: int = 2) -> dict[str, float]:
    """Fit the section's fields; fields its runs cannot inform (fp8 without fp8 runs) stay. The prior pulls toward
    the documented defaults, or toward the parent generation's values."""
    parent = {**table.get("default", {}), **_get(table, section.parent)} if section.parent else {}
    defaults = Calibration(**parent) if parent else Calibration()
    values = _get(table, section.key)
    has_fp8 = any(r.plan.precision == "fp8" for r in runs)
    for _ in range(rounds):
        for fld in section.fields:
            if fld == "fp8_eff" and not has_fp8:
                continue
            base = getattr(defaults, fld)

            def objective(x: float, fld=fld, base=base) -> float:
                trial = _put(table, section.key, {**values, fld: x})
                return log_error(runs, trial) + prior * math.log(x / base) ** 2

            values[fld] = round(_golden(objective, *BOUNDS[fld]), 4)
    return values


def fit(runs: list[Run], *, prior: float = 0.02, scheme: str = "part") -> dict[str, dict]:
    """Fitted table ``{generation: {constant: value, library: {constant: value}}, part: {...}, "default": {...}}``
    for every section that has runs: a generation's from its runs that no other section covers (all of its runs
    when every one is covered), then the library sub-tables and part sections from theirs, twice around."""
    others: dict[Section, list[Run]] = {}
    gens: dict[str, list[Run]] = {}
    clean: dict[str, list[Run]] = {}
    for r in runs:
        extra = sections_of(r, scheme=scheme)
        gens.setdefault(r.cluster.gpu.generation, []).append(r)
        if not extra:
            clean.setdefault(r.cluster.gpu.generation, []).append(r)
        for sec in extra:
            others.setdefault(sec, []).append(r)
    order = [(Section(key=(g,), fields=FIT_FIELDS), clean.get(g) or gens[g]) for g in sorted(gens)]
    order += sorted(others.items(), key=lambda kv: kv[0].key)
    table: dict[str, dict] = {}
    moe_runs = [r for r in runs if r.model.is_moe]
    for _ in range(2):
        for sec, rs in order:
            table = _put(table, sec.key, fit_section(rs, sec, table, prior=prior))
        if moe_runs:
            # One constant for all generations, informed by the MoE runs only (too few to split).
            shared = Section(key=("default",), fields=SHARED_FIELDS)
            table["default"] = fit_section(moe_runs, shared, table, prior=prior)
    table["default"] = {**table.get("default", {}), **unseen_generation(table, gens)}
    return dict(sorted(table.items()))


def unseen_generation(table: dict[str, dict], gens: dict[str, list[Run]]) -> dict[str, float]:
    """What a generation without published runs gets: the fitted generations' constants, geometric mean weighted
    by the runs that inform each (fp8 runs for ``fp8_eff``): a new generation reaches the fraction of its peak that
    the measured ones reach end to end, not the micro-benchmark defaults of ``spec.calibration``. A field no
    generation fitted keeps its default."""
    out = {}
    for fld in FIT_FIELDS:
        pairs = [(sum(fld != "fp8_eff" or r.plan.precision == "fp8" for r in rs), table[g][fld])
                 for g, rs in gens.items() if fld in table.get(g, {})]
        total = sum(n for n, _ in pairs)
        if total:
            out[fld] = round(math.exp(sum(n * math.log(v) for n, v in pairs) / total), 4)
    return out


def write_table(table: dict[str, dict], path: str | Path, *, source: str) -> None:
    """Write the fitted constants as TOML with a provenance header."""
    import tomli_w

    known = {f.name for f in fields(Calibration)}
    for name, section in table.items():
        for sub in [section] + [v for v in section.values() if isinstance(v, dict)]:
            assert {k for k, v in sub.items() if not isinstance(v, dict)} <= known, name
    header = (f"# Fitted by `python scripts/fit_calibration.py` from {source}.\n"
              "# Do not edit by hand: rerun the script. Fields not listed keep the documented defaults in\n"
              "# meshplan/spec/calibration.py; a generation's [gen.library] sub-table holds the constants of runs\n"
              "# on another kernel library than NVIDIA's (pulled toward the generation's values).\n")
    Path(path).write_text(header + tomli_w.dumps(table))
