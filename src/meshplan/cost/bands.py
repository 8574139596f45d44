"""Error bands: how far a prediction may be from the measurement, from the model's own record on runs it was not
fitted to.

Each visible published run is predicted with constants fitted without its source (leave-one-source-out, the
honest error on a new source; ``loso_residuals``). The signed relative errors are grouped by what predicts them:
the layout's kind (``kind_of``: MoE, pipeline, FSDP/ZeRO-3, other) and the GPU generation. A prediction's 80 %
band is the 10th-90th percentile of the errors of its most specific group with at least ``MIN_ROWS`` runs
((kind, generation), then kind, then all). A layout whose kind no validated run shows near its scale (a factor of
4 in GPU count, same generation) is flagged, and its band is all runs' 5th-95th percentiles.

``scripts/fit_error_bands.py`` refits and writes ``calibrate/error_bands.csv`` (one row per run: id, kind, generation,
GPUs, LOSO error); nothing here is edited by hand.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from functools import lru_cache

from meshplan.cost.calib import shipped_rows

MIN_ROWS = 8
"""Smallest group whose own percentiles are used (fewer rows fall back to the coarser group)."""

LEVEL = 0.8
"""The band's stated coverage."""

BANDS_FILE = "error_bands.csv"


def kind_of(model, plan) -> str:
    """The layout family whose errors the band reads: ``moe``, ``pp``, ``fsdp`` or ``dense`` (the first that
    applies, most error-prone first)."""
    if model.is_moe:
        return "moe"
    if plan.pp > 1:
        return "pp"
    if plan.zero == 3:
        return "fsdp"
    return "dense"


@dataclass(frozen=True, kw_only=True)
class Residual:
    """One published run predicted without its source."""

    id: str
    kind: str
    generation: str
    n_gpus: int
    error: float
    """predicted / measured - 1."""


@dataclass(frozen=True, kw_only=True)
class Band:
    """A prediction's error band."""

    lo: float
    """Lower end of predicted / measured - 1 (e.g. -0.05: the prediction may be 5 % too fast)."""
    hi: float
    """Upper end (e.g. +0.08: the prediction may be 8 % too slow)."""
    group: str
    """The runs the band comes from, e.g. ``pp on hopper (31 runs)``."""
    covered: bool
    """Some validated run has this layout kind on this generation within a factor of 4 in GPUs."""
    note: str = ""
    """Why the band is wide, when not covered."""

    def interval(self, predicted: float) -> tuple[float, float]:
        """(fast, slow) measured step times the band allows for a prediction (s): measured = predicted / (1 + e)."""
        return predicted / (1 + self.hi), predicted / (1 + self.lo)

    @property
    def half_width_pct(self) -> float:
        """Half the band's width (%)."""
        return 50.0 * (self.hi - self.lo)


def quantile(xs: list[float], q: float) -> float:
    """Quantile at the (n + 1) q plotting position (Hyndman & Fan 1996, definition 6; numpy's ``weibull``): the
    interval between two such quantiles holds a new draw from the same errors with the stated probability, where
    numpy's default (definition 7) is narrower on the small groups a band reads (8-30 runs)."""
    s = sorted(xs)
    h = (len(s) + 1) * q
    if h <= 1:
        return s[0]
    if h >= len(s):
        return s[-1]
    i = int(h)
    return s[i - 1] + (h - i) * (s[i] - s[i - 1])


def band_from(residuals: list[Residual], *, kind: str, generation: str, n_gpus: int) -> Band:
    """The band of a layout of ``kind`` on ``generation`` with ``n_gpus`` GPUs, from these residuals."""
    lo_q, hi_q = (1 - LEVEL) / 2, 1 - (1 - LEVEL) / 2
    for name, rows in ((f"{kind} on {generation}", [r for r in residuals if r.kind == kind
                                                     and r.generation == generation]),
                       (kind, [r for r in residuals if r.kind == kind]), ("all runs", residuals)):
        if len(rows) >= MIN_ROWS:
            break
    near = [r for r in residuals if r.kind == kind and r.generation == generation and
            n_gpus / 4 <= r.n_gpus <= 4 * n_gpus]
    if near:
        errs = [r.error for r in rows]
        return Band(lo=quantile(errs, lo_q), hi=quantile(errs, hi_q), group=f"{name} ({len(rows)} runs)",
                    covered=True)
    errs = [r.error for r in residuals]
    lo, hi = quantile(errs, lo_q / 2), quantile(errs, 1 - lo_q / 2)
    return Band(lo=lo, hi=hi, group=f"all runs ({len(residuals)}), widened", covered=False,
                note=f"no published {kind} run on {generation} within 4x of {n_gpus} GPUs")


@lru_cache(maxsize=1)
def shipped() -> tuple[Residual, ...]:
    """The residuals ``scripts/fit_error_bands.py`` wrote."""
    return tuple(Residual(id=r["id"], kind=r["kind"], generation=r["generation"], n_gpus=int(r["n_gpus"]),
                          error=float(r["loso_error"])) for r in shipped_rows(BANDS_FILE))


def band_for(model, cluster, plan) -> Band | None:
    """The shipped band of a prediction (None when no residuals ship)."""
    res = list(shipped())
    if not res:
        return None
    gen = min((p.gpu.generation for p in cluster.pools), key=lambda g: g)
    return band_from(res, kind=kind_of(model, plan), generation=gen, n_gpus=cluster.n_gpus)


def coverage(residuals: list[Residual], *, cross: bool = False, source=lambda r: r.id.split("-")[0]) -> float:
    """Share of runs whose measured time lies in their band. ``cross``: each run's band is built without its own
    source's residuals (the band's own leave-one-source-out)."""
    inside = 0
    for r in residuals:
        pool = [x for x in residuals if source(x) != source(r)] if cross else residuals
        b = band_from(pool, kind=r.kind, generation=r.generation, n_gpus=r.n_gpus)
        inside += b.lo <= r.error <= b.hi
    return inside / len(residuals) if residuals else 0.0


def summary(residuals: list[Residual]) -> dict:
    """Median absolute LOSO error per kind (%)."""
    kinds = sorted({r.kind for r in residuals})
    return {k: 100 * statistics.median(abs(r.error) for r in residuals if r.kind == k) for k in kinds}


def pessimism(model, cluster, plan) -> float:
    """The slow end of a prediction's band as a factor on the predicted step (1 without shipped bands)."""
    band = band_for(model, cluster, plan)
    return 1.0 / (1.0 + band.lo) if band is not None else 1.0


@lru_cache(maxsize=1)
def least_pessimism() -> float:
    """The smallest ``pessimism`` any layout can get: the factor a lower bound of the robust objective uses."""
    res = list(shipped())
    if not res:
        return 1.0
    keys = {(r.kind, r.generation) for r in res}
    los = [band_from(res, kind=k, generation=g, n_gpus=n).lo for k, g in keys
           for n in sorted({r.n_gpus for r in res})]
    errs = [r.error for r in res]
    los.append(quantile(errs, (1 - LEVEL) / 4))  # the widened band of an uncovered layout
    return 1.0 / (1.0 + max(los))
