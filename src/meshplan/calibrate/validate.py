"""Hold predictions against published runs: per-row signed error, MAPE, median and max absolute error."""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from meshplan.calibrate.csvfile import csv_header
from meshplan.calibrate.longseq import is_longseq_csv, load_longseq_runs
from meshplan.calibrate.pairs import Pair, find_pairs, summary
from meshplan.calibrate.runs import load_runs
from meshplan.cost.estimate import estimate


@dataclass(frozen=True, kw_only=True)
class RowResult:
    """One run's prediction."""

    id: str
    """Row id."""
    measured_s: float
    """Published step time (s)."""
    predicted_s: float
    """meshplan's step time (s)."""
    peak_memory_gib: float
    """Predicted peak memory per GPU (GiB)."""
    framework: str = ""
    """The stack profile the row was predicted under, and how it was chosen from its columns."""
    recipes: tuple[str, ...] = ()
    """The framework recipes applied to it."""

    @property
    def error_pct(self) -> float:
        """Signed error, positive = predicted slower than measured (%)."""
        return 100.0 * (self.predicted_s - self.measured_s) / self.measured_s


@dataclass(frozen=True, kw_only=True)
class ValidationReport:
    """All rows, their summary statistics, and the rows that could not be expressed."""

    rows: tuple[RowResult, ...]
    """Predicted rows."""
    skipped: tuple[tuple[str, str], ...]
    """(id, reason) of rows that could not be expressed."""
    pairs: tuple[Pair, ...] = ()
    """Rows of one job differing in one or two knobs (``calibrate.pairs``)."""

    def _ape(self) -> list[float]:
        return [abs(r.error_pct) for r in self.rows]

    @property
    def mape(self) -> float:
        """Mean absolute percentage error (%)."""
        return statistics.fmean(self._ape()) if self.rows else 0.0

    @property
    def median_ape(self) -> float:
        """Median absolute percentage error (%)."""
        return statistics.median(self._ape()) if self.rows else 0.0

    @property
    def max_ape(self) -> float:
        """Largest absolute percentage error (%)."""
        return max(self._ape(), default=0.0)

    def as_dict(self) -> dict:
        """The JSON shape of ``meshplan validate --json``."""
        return {"rows": [{"id": r.id, "measured_s": r.measured_s, "predicted_s": r.predicted_s,
                          "error_pct": r.error_pct, "framework": r.framework, "recipes": list(r.recipes)}
                         for r in self.rows],
                "n": len(self.rows), "mape_pct": self.mape, "median_ape_pct": self.median_ape,
                "max_ape_pct": self.max_ape, "skipped": [{"id": i, "reason": why} for i, why in self.skipped],
                "pairs": [{"a": p.a, "b": p.b, "knobs": list(p.knobs), "measured_ratio": p.measured_ratio,
                           "predicted_ratio": p.predicted_ratio, "ratio_error_pct": p.ratio_error_pct,
                           "order_right": p.order_right, "tie": p.tie} for p in self.pairs],
                "pairs_summary": summary(list(self.pairs))}


def validate_csv(path: str | Path, *, calib: dict | None = None, simulate: bool = False) -> ValidationReport:
    """Predict every expressible row of a runs CSV, or of a long-sequence/offload/multimodal CSV (the rows the
    training model describes: ``calibrate.longseq``), pipelines by closed form or by the event simulator."""
    runs, skipped = load_longseq_runs(path) if is_longseq_csv(csv_header(path)) else load_runs(path)
    pipeline = None
    if simulate:
        from meshplan.sim.adapter import simulated_pipeline

        pipeline = simulated_pipeline()
    rows = []
    for r in runs:
        est = estimate(r.model, r.cluster, r.plan, stack=r.framework, calib=calib, pipeline=pipeline)
        rows.append(RowResult(id=r.id, measured_s=r.measured_s, predicted_s=est.step_time,
                              peak_memory_gib=est.peak_memory / 2**30, framework=r.profile_note,
                              recipes=r.recipes))
    pairs = find_pairs(runs, {r.id: r.predicted_s for r in rows})
    return ValidationReport(rows=tuple(rows), skipped=tuple(skipped), pairs=tuple(pairs))


def skip_kinds(skipped: tuple[tuple[str, str], ...] | list[tuple[str, str]]) -> dict[str, int]:
    """How many skipped rows share each reason ("offload: CPU offload is not modelled yet"), its value and close
    matches left out, most frequent first."""
    kinds: dict[str, int] = {}
    for _, why in skipped:
        m = re.match(r"""[^.\s]+\.(\w+) = ('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|\S+): (.*?)(?: \(did you mean.*)?$""",
                     why)
        key = f"{m.group(1)}: {m.group(3)}" if m else why
        kinds[key] = kinds.get(key, 0) + 1
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1]))
