#!/usr/bin/env python
"""Where the serving model's TTFT error lives. ``meshplan validate`` splits TTFT rows as the dataset's conventions
do (INFERENCE.md: queue-dominated once the requests in flight no longer fit the KV cache; the model's steady state
decides which rows those are). This prints a second split of the rows that are not queue-dominated in that sense:
closed loops whose predicted TTFT (the benchmark replay's) is more than twice a lone request's, i.e. mostly
waiting behind the other clients' prompts that arrive together ("waves"), against the rest, whose TTFT is mostly
their own prefill. The measured side is split the same way, by each row's TTFT against the same configuration's
measured one-client TTFT, to show the two splits agree.

Usage: python benchmarks/bench_serve_ttft_split.py [inference.csv]"""

import csv
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from meshplan.calibrate.serve_constants import load_constants
from meshplan.calibrate.serve_validate import predict_row, reported, row_context
from meshplan.cost.serve_load import predict_load
from meshplan.errors import MeshplanError

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT.parent / "shared" / "validation" / "inference_visible.csv"


def alone_ttft(row: dict, consts: dict) -> float:
    """A lone request's TTFT (ms) on the row's deployment: its own prefill and the request path."""
    ctx, _, work = row_context(row, consts)
    return reported(predict_load(ctx, replace(work, concurrency=1, rate=0.0), replicas=1), "ttft_ms", ctx.engine)


def config(row: dict) -> tuple:
    return tuple(row[k] for k in ("source", "model_key", "gpu_key", "tp", "input_len", "output_len"))


def main() -> int:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    rows = [r for r in csv.DictReader(path.open()) if r["metric"].strip() == "ttft_ms"]
    consts = load_constants()
    one = {config(r): float(r["value"]) for r in rows if (r.get("concurrency") or "").strip() == "1"}
    groups: dict[str, list[float]] = {"own prefill": [], "waves": []}
    agree = total = 0
    for r in rows:
        try:
            got, _ = predict_row(r, consts)
        except MeshplanError:
            continue
        if got is None or got.queue_dominated:
            continue
        waves = got.predicted > 2 * alone_ttft(r, consts)
        groups["waves" if waves else "own prefill"].append(abs(got.error_pct))
        if config(r) in one:
            total += 1
            agree += waves == (got.measured > 2 * one[config(r)])
    print("TTFT rows that are not queue-dominated (the dataset's convention), split by what the prediction is made of")
    print(f"{'part':>12s} {'rows':>5s} {'MAPE %':>7s} {'median %':>9s}")
    for name, ape in groups.items():
        if ape:
            print(f"{name:>12s} {len(ape):5d} {statistics.fmean(ape):7.1f} {statistics.median(ape):9.1f}")
    print(f"the measured rows split the same way (against their one-client TTFT) in {agree} of {total} rows that "
          "have one")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
