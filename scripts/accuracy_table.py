#!/usr/bin/env python
"""Print the README's accuracy table: `meshplan validate` on the visible runs, per source and overall.
Usage: python scripts/accuracy_table.py [runs.csv]"""

import statistics
import sys
from collections import defaultdict
from pathlib import Path

from meshplan.calibrate.validate import validate_csv

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else str(ROOT.parent / "shared/validation/runs_visible.csv")
    report = validate_csv(path)
    groups = defaultdict(list)
    for r in report.rows:
        groups[r.id.split("-")[0]].append(r.error_pct)
    print("| source (id prefix) | runs | median abs. error | max abs. error | mean signed error |")
    print("|---|---:|---:|---:|---:|")
    for name, errs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        ape = [abs(e) for e in errs]
        print(f"| {name} | {len(errs)} | {statistics.median(ape):.1f} % | {max(ape):.1f} % | "
              f"{statistics.fmean(errs):+.1f} % |")
    print(f"| **all** | {len(report.rows)} | {report.median_ape:.1f} % | {report.max_ape:.1f} % | "
          f"MAPE {report.mape:.1f} % |")


if __name__ == "__main__":
    main()
