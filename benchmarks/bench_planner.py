"""The planner against every published layout (94 runs): it must find a plan the cost model rates no slower, on
the same stack and memory rule (the suite checks every third run; this checks all). Prints the runs it beats."""

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "validation"))

from test_planner_vs_published import CSV, ROBUST, compare_with_published  # noqa: E402

from meshplan.calibrate.runs import load_runs  # noqa: E402

t0 = time.perf_counter()
runs, _ = load_runs(CSV)
slower, faster = compare_with_published(runs)
robust = sum(ROBUST in line for line in faster)
print(f"{len(runs)} runs in {time.perf_counter() - t0:.0f} s: {len(faster)} have a faster plan ({robust} still "
      f"faster at the slow end of its 80 % error band than the published run measured), {len(slower)} cannot be "
      "matched")
for line in faster:
    print("  " + line)
for s in slower:
    print("  SLOWER", s)
sys.exit(1 if slower else 0)
