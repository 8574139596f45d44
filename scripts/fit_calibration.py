#!/usr/bin/env python
"""Refit meshplan's calibration constants from the visible published runs and write
src/meshplan/calibrate/constants.toml. Usage: python scripts/fit_calibration.py [runs.csv]"""

import sys
import time
from pathlib import Path

from meshplan.calibrate.fit import fit, log_error, write_table
from meshplan.calibrate.runs import load_runs

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    csv_path = sys.argv[1] if len(sys.argv) > 1 else str(ROOT.parent / "shared/validation/runs_visible.csv")
    runs, skipped = load_runs(csv_path)
    if not runs:  # never overwrite the shipped constants with a fit of nothing
        first = f" (first: {skipped[0][0]}: {skipped[0][1]})" if skipped else ""
        sys.exit(f"error: no run of {csv_path} could be predicted{first}; constants.toml left as it was")
    out = ROOT / "src/meshplan/calibrate/constants.toml"
    t0 = time.time()
    before = log_error(runs, {})
    table = fit(runs)
    after = log_error(runs, table)
    write_table(table, out, source=Path(csv_path).name + f" ({len(runs)} runs, {len(skipped)} skipped)")
    print(f"mean |log error| {before:.4f} -> {after:.4f} in {time.time() - t0:.0f} s")
    for name, values in table.items():
        print(f"  [{name}] " + ", ".join(f"{k}={v}" for k, v in values.items()))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
