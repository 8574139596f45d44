"""Leave-one-source-out predictions of the published runs: each source's runs predicted with constants fitted on
the other sources' runs (the error a new source should expect; ``benchmarks/bench_cross_validation.py`` prints the
per-source table, ``cost.bands`` turns the errors into bands)."""

from __future__ import annotations

from meshplan.calibrate.fit import fit
from meshplan.calibrate.runs import Run
from meshplan.cost.estimate import estimate


def source_of(run: Run) -> str:
    """A run's source: the prefix of its id (one paper, recipe collection or benchmark suite)."""
    return run.id.split("-")[0]


def loso_errors(runs: list[Run], *, scheme: str = "part") -> dict[str, float]:
    """predicted / measured - 1 of every run, predicted under constants fitted without its source."""
    out = {}
    for name in sorted({source_of(r) for r in runs}):
        table = fit([r for r in runs if source_of(r) != name], scheme=scheme)
        for r in runs:
            if source_of(r) == name:
                pred = estimate(r.model, r.cluster, r.plan, stack=r.framework, calib=table).step_time
                out[r.id] = pred / r.measured_s - 1
    return out
