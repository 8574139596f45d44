"""Closed-loop agreement of the cost model with this machine: MAPE, Kendall tau and regret over the covering plans
of ``meshplan check``, under each way of turning interleaved rounds into one time (fastest round, median round,
median CPU time), as the median over a few independent launches.

    .venv/bin/python benchmarks/bench_closed_loop.py [--runs 3] [--rounds 5] [--hardware hw.toml]

Calibrates once (unless --hardware), predicts once, then times every plan ``--runs`` times (one torchrun launch
each, plans interleaved inside a launch).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path


def _figures(labels: list[str], pred: list[float], meas: list[float]) -> tuple[float, float, float]:
    from meshplan.cli.check import score

    s = score(labels, pred, meas)
    return s["mape_pct"], s["kendall_tau"], s["regret_pct"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="small-llama")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--hardware", default="")
    args = ap.parse_args()

    from meshplan import catalog
    from meshplan.calibrate.agreement import CheckSpace
    from meshplan.cli.check import STATS, measure_all, predict
    from meshplan.runtime.closed_loop import covering, enumerate_plans, plan_label

    with tempfile.TemporaryDirectory(prefix="bench-closed-loop-") as tmp:
        hw = args.hardware
        if not hw:
            from meshplan.cli.calibrate import calibrate_to

            hw = str(Path(tmp) / "local.toml")
            calibrate_to(hw, nproc=args.nproc, base="cpu", min_time_s=0.05)
        plans = covering(enumerate_plans(catalog.model(args.model),
                                         CheckSpace(world=args.nproc, global_batch=4, seq_len=256)))
        labels = [plan_label(p) for p in plans]
        pred = predict(args.model, hw, plans, args.nproc)
        runs = [measure_all(args.model, plans, world=args.nproc, warmup=args.warmup, rounds=args.rounds,
                            timeout_s=1800) for _ in range(args.runs)]
    print(f"{len(plans)} plans, {args.runs} launches x {args.rounds} rounds")
    for stat in STATS:
        figs = [_figures(labels, pred, r[f"{stat}_s"]) for r in runs]
        med = [statistics.median(f[i] for f in figs) for i in range(3)]
        spread = [max(f[1] for f in figs) - min(f[1] for f in figs)]
        print(f"{stat:>10}: MAPE {med[0]:6.1f} %   tau {med[1]:5.2f} (spread {spread[0]:.2f})   "
              f"regret {med[2]:5.1f} %")
    per_plan = [statistics.median(r["min_s"][i] for r in runs) for i in range(len(plans))]
    for lab, p, m in sorted(zip(labels, pred, per_plan), key=lambda x: x[2]):
        print(f"  {lab:<32} predicted {p:7.3f} s   measured(min) {m:7.3f} s   {100 * (p - m) / m:+6.1f} %")


if __name__ == "__main__":
    main()
