#!/usr/bin/env python
"""Leave-one-source-out cross-validation of the serving constants: for each source of the serving measurements,
refit the constants (``scripts/fit_serving.py``'s fit) on the other sources' rows and predict the held-out
source's rows. A constant only the held-out source informs falls back as it would for an engine or GPU no visible
row uses: an engine family none of the other sources ran takes the median of the fitted engines' host times
(``serve_step.unseen_family``), a GPU generation none ran the median of the fitted generations' kernel constants
(``serve_step.per_generation``). Takes a few minutes.

Usage: python benchmarks/bench_serve_loso.py [inference.csv]"""

import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from meshplan.calibrate.serve_fit import fit_rows
from meshplan.calibrate.serve_validate import predict_row
from meshplan.errors import MeshplanError

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT.parent / "shared" / "validation" / "inference_visible.csv"


def _group(metric: str, queue_dominated: bool) -> str:
    return metric + (" (queue-dominated)" if metric == "ttft_ms" and queue_dominated else "")


def held_out_errors(rows: list[dict]) -> dict[str, list[tuple[str, float]]]:
    """(source, |error| %) of every predictable row, grouped by metric, each predicted by constants fitted
    without its source."""
    by_source = defaultdict(list)
    for r in rows:
        by_source[r["source"]].append(r)
    out = defaultdict(list)
    for source, mine in sorted(by_source.items()):
        consts = fit_rows([r for r in rows if r["source"] != source])
        for row in mine:
            try:
                got, _ = predict_row(row, consts)
            except MeshplanError:
                continue
            if got is not None:
                out[_group(got.metric, got.queue_dominated)].append((source, abs(got.error_pct)))
        print(f"  held out {source[:70]}: {len(mine)} rows, constants {consts}", flush=True)
    return out


def main() -> int:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    errs = held_out_errors(rows)
    print(f"\nleave-one-source-out on {path.name}:")
    print(f"{'metric':28s} {'n':>4s} {'MAPE %':>7s} {'median %':>9s} {'max %':>7s}")
    for key in sorted(errs):
        e = [v for _, v in errs[key]]
        print(f"{key:28s} {len(e):4d} {statistics.fmean(e):7.1f} {statistics.median(e):9.1f} {max(e):7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
