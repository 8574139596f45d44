#!/usr/bin/env python
"""Predict every visible published run without its source (leave-one-source-out refits) and write the residuals
the error bands read: src/meshplan/calibrate/error_bands.csv. Takes a few minutes.
Usage: python scripts/fit_error_bands.py [runs.csv]"""

import csv
import sys
from pathlib import Path

from meshplan.calibrate.loso import loso_errors
from meshplan.calibrate.runs import load_runs
from meshplan.cost.bands import BANDS_FILE, Residual, coverage, kind_of

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    path = sys.argv[1] if len(sys.argv) > 1 else str(ROOT.parent / "shared/validation/runs_visible.csv")
    runs, _ = load_runs(path)
    errors = loso_errors(runs)
    rows = [Residual(id=r.id, kind=kind_of(r.model, r.plan), generation=r.cluster.gpu.generation,
                     n_gpus=r.cluster.n_gpus, error=errors[r.id]) for r in runs]
    out = ROOT / "src/meshplan/calibrate" / BANDS_FILE
    with out.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "kind", "generation", "n_gpus", "loso_error"])
        for x in rows:
            w.writerow([x.id, x.kind, x.generation, x.n_gpus, f"{x.error:.6f}"])
    print(f"wrote {out}: {len(rows)} runs; 80 % band coverage {100 * coverage(rows):.0f} % "
          f"(bands rebuilt without each run's source: {100 * coverage(rows, cross=True):.0f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
