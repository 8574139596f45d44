#!/usr/bin/env python
"""Would the long-sequence rows improve the calibration? The shipped constants are fitted on the visible runs
alone; this refits them, in memory, with the long-sequence rows the training model predicts beside them
(``calibrate.longseq.anchor_runs``: NeMo's two CP tables and torchtitan's tables 2 and 6, less the rows the visible
set holds) and prints, for both fits: the visible runs' and all predictable long-sequence rows' MAPE, the Hopper
and Blackwell constants, and with ``--loso`` the visible runs' leave-one-source-out median, MAPE and worst error
(a long-sequence row leaves with the visible source that cites its document) and the coverage of the 80 % error
bands those residuals would give (the bands' own test holds it to 75-85 %). A few minutes with ``--loso``.

Usage: python benchmarks/bench_longseq_fit.py [--loso]"""

import statistics
import sys
from pathlib import Path

from meshplan.calibrate.fit import fit
from meshplan.calibrate.longseq import anchor_runs, load_longseq_runs
from meshplan.calibrate.loso import source_of
from meshplan.calibrate.runs import load_runs
from meshplan.cost.bands import Residual, coverage, kind_of
from meshplan.cost.estimate import estimate

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "validation"


def error(run, table) -> float:
    return estimate(run.model, run.cluster, run.plan, stack=run.framework, calib=table).step_time / run.measured_s - 1


def mape(runs, table) -> float:
    return statistics.fmean(abs(error(r, table)) * 100 for r in runs)


def loso(visible, extra) -> None:
    """Each visible source predicted by constants fitted without it (and without ``extra``'s rows of it)."""
    errs = {}
    for name in sorted({source_of(r) for r in visible}):
        table = fit([r for r in visible + extra if source_of(r) != name])
        errs.update({r.id: error(r, table) for r in visible if source_of(r) == name})
    pct = [abs(e) * 100 for e in errs.values()]
    res = [Residual(id=r.id, kind=kind_of(r.model, r.plan), generation=r.cluster.gpu.generation,
                    n_gpus=r.cluster.n_gpus, error=errs[r.id]) for r in visible]
    print(f"  leave-one-source-out: median {statistics.median(pct):.2f} %, MAPE {statistics.fmean(pct):.2f} %, "
          f"worst {max(pct):.1f} %; 80 % band coverage {100 * coverage(res):.0f} % "
          f"(built without each run's source {100 * coverage(res, cross=True):.0f} %)", flush=True)


def main() -> None:
    visible, _ = load_runs(SHARED / "runs_visible.csv")
    longseq, skipped = load_longseq_runs(SHARED / "longseq_offload_mm.csv")
    anchors = anchor_runs(visible, SHARED)
    print(f"{len(visible)} visible runs; {len(longseq)} predictable long-sequence rows ({len(skipped)} of the set "
          f"skipped), {len(anchors)} of them not visible runs already")
    fits = (("visible runs alone (shipped)", visible, []), ("visible + long-sequence rows", visible + anchors, anchors))
    for name, rows, extra in fits:
        table = fit(rows)
        print(f"{name}: visible MAPE {mape(visible, table):.2f} %, long-sequence MAPE {mape(longseq, table):.2f} %")
        for gen in ("hopper", "blackwell"):
            print(f"  [{gen}] {table.get(gen, {})}")
        if "--loso" in sys.argv:
            loso(visible, extra)


if __name__ == "__main__":
    main()
