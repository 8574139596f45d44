#!/usr/bin/env python
"""Leave-one-source-out cross-validation of the calibration: for each source in the visible runs, refit the
constants without that source's rows and predict them. The error on unseen sources is the honest estimate of how
the model does on the held-out set (other runs, other sources). Takes a few minutes per scheme; ``--compare``
also scores the alternatives the shipped ``part`` scheme was chosen against (``meshplan.calibrate.fit.SCHEMES``): a
kernel-library sub-table for the attention constant (``[hopper.pytorch]``, the GPU part keeping only its GEMM
constants), and one section per generation (no part section).

Usage: python benchmarks/bench_cross_validation.py [runs.csv] [--compare]"""

import statistics
import sys
from collections import defaultdict
from pathlib import Path

from meshplan.calibrate.fit import SCHEMES, fit
from meshplan.calibrate.runs import load_runs
from meshplan.cost.estimate import estimate

ROOT = Path(__file__).resolve().parent.parent


def _error(run, table) -> float:
    pred = estimate(run.model, run.cluster, run.plan, stack=run.framework, calib=table).step_time
    return abs(pred / run.measured_s - 1) * 100


def cross_validate(runs, *, scheme: str) -> None:
    """Print the per-source table and the totals for one fit configuration."""
    groups = defaultdict(list)
    for r in runs:
        groups[r.id.split("-")[0]].append(r)
    full = fit(runs, scheme=scheme)
    inside = [_error(r, full) for r in runs]
    held = []
    print(f"\ncalibration scheme: {scheme}")
    print("| left-out source | runs | median abs. error | max abs. error |")
    print("|---|---:|---:|---:|")
    for name, rows in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        table = fit([r for r in runs if r.id.split("-")[0] != name], scheme=scheme)
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
    for scheme in SCHEMES if "--compare" in sys.argv else SCHEMES[:1]:
        cross_validate(runs, scheme=scheme)


if __name__ == "__main__":
    main()
