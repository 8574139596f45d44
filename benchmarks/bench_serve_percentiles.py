#!/usr/bin/env python
"""Serving percentiles against the only published ones: NVIDIA's MLPerf Inference v4.1 Llama-2-70B Server runs,
whose LoadGen summaries give p50/p90/p99 of TTFT, TPOT and end-to-end latency at a stated Poisson rate. Each run is
predicted at its own scheduled rate (an input of the run: LoadGen issues queries at it), on the deployment of the
matching row of the serving CSV, so what is compared is the spread the model puts around its means: the remainder
of the step a request lands in, the step its prompt joins, its own prompt and its own output (``cost/serve_tail``).

Usage: python benchmarks/bench_serve_percentiles.py [inference.csv]"""

import csv
import sys
from dataclasses import replace
from pathlib import Path

from meshplan.calibrate.serve_constants import load_constants
from meshplan.calibrate.serve_validate import row_context
from meshplan.cost.serve_load import predict_load
from meshplan.cost.serve_tail import quantile

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT.parent / "shared" / "validation" / "inference_visible.csv"

# mlcommons/inference_results_v4.1@a2f5d66d closed/NVIDIA/results/<system>/llama2-70b-99[.9]/Server/performance/
# run_1/mlperf_log_summary.txt: "Scheduled samples per second", then mean, p50, p90, p99 of first-token latency,
# time to output token (ms) and latency (s).
PUBLISHED = {
    "mlperf41-llama2-70b-h200x8-server-tpot_ms": {
        "rate": 101.25,
        "ttft": (198.27, 180.76, 309.53, 452.74),
        "tpot": (123.26, 124.29, 133.47, 146.04),
        "e2e": (35.855, 31.107, 65.052, 118.861),
    },
    "mlperf41-llama2-70b-h100x8-server-tpot_ms": {
        "rate": 75.10,
        "ttft": (275.93, 272.95, 372.92, 461.28),
        "tpot": (154.96, 156.42, 165.77, 175.35),
        "e2e": (44.955, 39.053, 81.391, 144.813),
    },
}
QUANTILES = (0.5, 0.9, 0.99)
SCALE = {"ttft": 1e3, "tpot": 1e3, "e2e": 1.0}


def main() -> int:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    rows = {r["id"]: r for r in csv.DictReader(path.open(newline=""))}
    consts = load_constants()
    print(f"{'run':34s} {'metric':6s} {'stat':>5s} {'published':>10s} {'predicted':>10s} {'ratio':>6s}  "
          f"{'spread p99/p50 published':>24s} {'predicted':>9s}")
    for rid, pub in PUBLISHED.items():
        if rid not in rows:
            print(f"{rid}: not in {path}")
            continue
        ctx, plan, work = row_context(rows[rid], consts)
        pred = predict_load(ctx, replace(work, rate=pub["rate"], concurrency=0), replicas=plan.replicas)
        name = rid.removeprefix("mlperf41-llama2-70b-").removesuffix("-tpot_ms") + f" @ {pub['rate']:g}/s"
        for metric in ("ttft", "tpot", "e2e"):
            mean = SCALE[metric] * getattr(pred, metric)
            got = [mean] + [SCALE[metric] * quantile(pred, metric, q) for q in QUANTILES]
            for stat, m, p in zip(("mean", "p50", "p90", "p99"), pub[metric], got):
                print(f"{name:34s} {metric:6s} {stat:>5s} {m:10.3f} {p:10.3f} {p / m:6.2f}", end="")
                if stat == "p99":
                    print(f"  {pub[metric][3] / pub[metric][1]:24.2f} {got[3] / got[1]:9.2f}", end="")
                print()
        # Little's law on the published run: requests in the system = rate x mean latency, per replica
        little = pub["rate"] * pub["e2e"][0] / plan.replicas
        print(f"{name:34s} requests resident per replica: published {little:,.0f} (Little: rate x mean latency), "
              f"predicted {pred.resident:,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
