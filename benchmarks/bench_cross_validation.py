#!/usr/bin/env python
"""Leave-one-source-out cross-validation of the calibration: for each source in the visible runs, refit the
constants without that source's rows and predict them. The error on unseen sources is the honest estimate of how
the model does on the held-out set (other runs, other sources). Takes a few minutes; ``--compare`` also runs the
fit without kernel-library sub-tables (the GPU part's section then takes the attention constant too), to show
what the per-library constant buys.

Usage: python benchmarks/bench_cross_validation.py [runs.csv] [--compare]"""

import statistics
import sys
from collections import defaultdict
from pathlib import Path

from meshplan.calibrate.fit import fit
from meshplan.calibrate.runs import load_runs
from meshplan.cost.estimate import estimate

ROOT = Path(__file__).resolve().parent.parent


def _error(run, table) -> float:
    pred = estimate(run.model, run.cluster, run.plan, stack=run.framework, calib=table).step_time
    return abs(pred / run.measured_s - 1) * 100


def cross_validate(runs, *, library_sections: bool) -> None:
    """Print the per-source table and the totals for one fit configuration."""
    groups = defaultdict(list)
    for r in runs:
        groups[r.id.split("-")[0]].append(r)
    full = fit(runs, library_sections=library_sections)
    inside = [_error(r, full) for r in runs]
    held = []
    print(f"\nkernel-library sub-tables: {'on' if library_sections else 'off'}")
    print("| left-out source | runs | median abs. error | max abs. error |")
    print("|---|---:|---:|---:|")
    for name, rows in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        table = fit([r for r in runs if r.id.split("-")[0] != name], library_sections=library_sections)
        errs = [_error(r, table) for r in rows]
        held += errs
        print(f"| {name} | {len(rows)} | {statistics.median(errs):.1f} % | {max(errs):.1f} % |", flush=True)
    print(f"| **all, each predicted without its own source** | {len(held)} | {statistics.median(held):.1f} % | "
          f"{max(held):.1f} % (MAPE {statistics.fmean(held):.1f} %) |")
    print(f"in-sample: MAPE {statistics.fmean(inside):.1f} %, max {max(inside):.1f} %")


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    path = args[0] if args else str(ROOT.parent / "shared/validation/runs_visible.csv")
    runs, _ = load_runs(path)
    cross_validate(runs, library_sections=True)
    if "--compare" in sys.argv:
        cross_validate(runs, library_sections=False)


if __name__ == "__main__":
    main()
