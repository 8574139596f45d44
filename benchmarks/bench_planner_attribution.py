#!/usr/bin/env python
"""Where the planner's claimed speedups over published layouts come from. For a few published jobs: the planner's
choice, its predicted speedup over the published layout (both predicted, same stack and memory rule as
tests/validation/test_planner_vs_published.py), the 80 % error band of the choice (cost.bands) and what the
speedup is at the band's slow end against the published run's measured time, and how much of the speedup is left
when the search may only use the features the published run used: its sequence-parallel setting, no context
parallelism where it used none, its pipeline schedule (and no zero-bubble or V schedules), and its interleaving.
The rest of the speedup comes from features the published run did not (or, for older runs, could not) use.

Usage: python benchmarks/bench_planner_attribution.py [runs.csv] [--all]"""

import sys
from pathlib import Path

from meshplan.calibrate.runs import load_runs
from meshplan.cost.bands import band_for, pessimism
from meshplan.cost.estimate import estimate
from meshplan.report.layout import layout_short
from meshplan.search import SearchRequest, search

ROOT = Path(__file__).resolve().parents[1]
JOBS = ("narayanan21-t2-174p6b-ptd-1536g", "narayanan21-t1-310p1b", "tt2412-t5-405b-interleaved1f1b-512g",
        "mcore080-weak-32b", "dgxc-nemotron-4-340b-fp8-2048g", "mbridge2511-llama3-70b-h100-sxm-64g")
"""Published jobs the planner beats by the most, across sources and eras (2021 Megatron to 2025 Megatron-Bridge)."""


def features_used(plan) -> dict:
    """Pins that keep the search to what the published layout used."""
    pins = {"sp": plan.sp, "vpp": plan.vpp}
    if plan.cp == 1:
        pins["cp"] = 1
    if plan.pp > 1:
        pins["schedule"] = plan.schedule_name
    return pins


def best(run, frac: float, pins: dict):
    req = SearchRequest(global_batch=run.plan.global_batch, seq_len=run.plan.seq_len, precision=run.plan.precision,
                        framework=run.framework, max_memory_fraction=frac, simulate=False, top=1, pins=pins)
    return search(run.model, run.cluster, req).best


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    path = args[0] if args else str(ROOT.parent / "shared/validation/runs_visible.csv")
    runs, _ = load_runs(path)
    chosen = runs if "--all" in sys.argv else [r for r in runs if r.id in JOBS]
    print("| job | published layout | planner's choice | speedup | band (80 %) | at slow end vs measured | "
          "with the published run's features only | share from features it did not use |")
    print("|---|---|---|---:|---|---:|---:|---:|")
    for run in chosen:
        pub = estimate(run.model, run.cluster, run.plan, stack=run.framework)
        frac = max(0.8, pub.peak_memory / pub.capacity * (1 + 1e-9))
        full = best(run, frac, {})
        same = best(run, frac, features_used(run.plan))
        if full is None:
            continue
        sp_full = pub.step_time / full.estimate.step_time
        sp_same = pub.step_time / same.estimate.step_time if same is not None else 1.0
        band = band_for(run.model, full.cluster, full.plan)
        fast, slow = band.interval(full.estimate.step_time)
        robust = run.measured_s / (full.estimate.step_time * pessimism(run.model, full.cluster, full.plan))
        share = (sp_full - max(sp_same, 1.0)) / (sp_full - 1.0) if sp_full > 1.0 + 1e-9 else 0.0
        print(f"| {run.id} | {layout_short(run.plan)} | {layout_short(full.plan)} | {sp_full:.2f}x | "
              f"{fast:.2f}-{slow:.2f} s{'' if band.covered else ' (not covered)'} | {robust:.2f}x | "
              f"{sp_same:.2f}x | {100 * share:.0f} % |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
