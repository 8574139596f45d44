#!/usr/bin/env python
"""Predict the peak memory of every visible published run and write the record the planner's per-stack memory
limits read: src/meshplan/calibrate/memory_limits.csv (``cost.memory_limits``). Takes a few seconds.
Usage: python scripts/fit_memory_limits.py [runs.csv]"""

import csv
import sys
from pathlib import Path

from meshplan.calibrate.runs import load_runs
from meshplan.cost.estimate import estimate
from meshplan.cost.memory_limits import DEFAULT, LIMITS_FILE, RunPeak, limit_from

ROOT = Path(__file__).resolve().parent.parent


def peaks(path: str) -> list[RunPeak]:
    """Every run's predicted peak per GPU over its tightest GPU's memory."""
    runs, _ = load_runs(path)
    out = []
    for r in runs:
        est = estimate(r.model, r.cluster, r.plan, stack=r.framework)
        out.append(RunPeak(id=r.id, stack=r.framework.name, fraction=est.peak_memory / est.capacity))
    return out


def main() -> int:
    path = sys.argv[1] if len(sys.argv) > 1 else str(ROOT.parent / "shared/validation/runs_visible.csv")
    rows = peaks(path)
    out = ROOT / "src/meshplan/calibrate" / LIMITS_FILE
    with out.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "stack", "peak_fraction"])
        for x in rows:
            w.writerow([x.id, x.stack, f"{x.fraction:.4f}"])
    over = [x for x in rows if x.fraction > 1]
    high = sorted((x for x in rows if x.fraction > DEFAULT), key=lambda x: -x.fraction)
    print(f"wrote {out}: {len(rows)} runs, {len(over)} predicted above device memory"
          + (f" ({', '.join(x.id for x in over)})" if over else "")
          + f", {len(high)} above {100 * DEFAULT:.0f} %: " + ", ".join(f"{x.id} {100 * x.fraction:.1f}" for x in high))
    for stack in sorted({x.stack for x in rows}):
        lim = limit_from(rows, stack)
        print(f"  {stack:22s} {100 * lim.fraction:4.0f} %  {lim.why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
