#!/usr/bin/env python
"""Leave-one-source-out cross-validation of the calibration: for each source in the visible runs, refit the
constants without that source's rows and predict them. The median error on unseen sources is the honest
estimate of how the model does on the held-out set (other runs, other sources). Takes a few minutes."""

import statistics
import sys
from collections import defaultdict
from pathlib import Path

from meshplan.calibrate.fit import fit
from meshplan.calibrate.runs import load_runs
from meshplan.cost.estimate import estimate

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else str(ROOT.parent / "shared/validation/runs_visible.csv")
    runs, _ = load_runs(path)
    groups = defaultdict(list)
    for r in runs:
        groups[r.id.split("-")[0]].append(r)
    held = []
    print("| left-out source | runs | median abs. error | max abs. error |")
    print("|---|---:|---:|---:|")
    for name, rows in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        table = fit([r for r in runs if r.id.split("-")[0] != name])
        errs = [abs(estimate(r.model, r.cluster, r.plan, calib=table).step_time / r.measured_s - 1) * 100
                for r in rows]
        held += errs
        print(f"| {name} | {len(rows)} | {statistics.median(errs):.1f} % | {max(errs):.1f} % |", flush=True)
    print(f"| **all, each predicted without its own source** | {len(held)} | {statistics.median(held):.1f} % | "
          f"{max(held):.1f} % (MAPE {statistics.fmean(held):.1f} %) |")


if __name__ == "__main__":
    main()
