#!/usr/bin/env python
"""The transition model next to the published layout-switch anchors, and ``meshplan replan``'s answer time.

For each anchor: the bytes meshplan moves (busiest rank and in all), the rated-bandwidth bound, the calibrated
live time (transfer alone, as the anchors measure it with communicators built ahead, and with their set-up), the
checkpoint route, and the published figure. Layouts the sources do not publish are marked as our choice.
Then the replan speed target: Llama-3.1-405B on 16,384 H100 losing a node, under 2 s (median of repeats), in
process and as the command a user runs (``meshplan replan --from 405b.toml --lose-ranks 8000-8007``: start-up,
the plan file, the search, the three switches priced and the preview printed).

Usage: python benchmarks/bench_transition.py [repeats]"""

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from meshplan import catalog
from meshplan.calibrate.transition_fit import load_anchors, price, report
from meshplan.cost.transition_time import SwitchCosts, fitted_overhead
from meshplan.search import SearchRequest
from meshplan.search.replan import ClusterChange, ReplanRequest, replan
from meshplan.spec.io import parse_gpus
from meshplan.spec.plan import Plan


def anchors_table() -> None:
    anchors = load_anchors()
    print("\n".join(report(anchors, None)))
    print(f"\n{'anchor':52s} {'bound s':>8s} {'+groups s':>9s} {'ckpt s':>7s}")
    for a in anchors:
        over = fitted_overhead(catalog.gpu(a["gpu"]).generation)
        live = price(a, over, SwitchCosts(groups_prebuilt=False)).time
        print(f"{a['name'][:52]:52s} {live.bound_s:8.2f} {live.total_s:9.2f} {live.checkpoint_s:7.0f}")
    print("model s: the live switch with communicators built ahead (as every anchor runs); LOO: fitted without "
          "that anchor; bound: bytes at rated bandwidth; +groups: with communicator set-up; ckpt: save, restart, "
          "load at Llama 3's storage bandwidth per GPU")


def replan_speed(repeats: int) -> None:
    model = catalog.model("llama3.1-405b")
    cluster = parse_gpus("16384xh100-sxm", catalog.gpu)
    plan = Plan(global_batch=2048, seq_len=8192, tp=8, sp=True, pp=16, vpp=7, dp=128, zero=1)  # Llama 3 paper
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = replan(model, cluster, plan, change=ClusterChange(lost=tuple(range(8000, 8008))),
                     request=SearchRequest(global_batch=2048, seq_len=8192), rq=ReplanRequest(remaining_steps=1000))
        times.append(time.perf_counter() - t0)
    opt = res.options[res.choice]
    saved = (opt.to_move_default - opt.to_move) / 2**30
    print(f"replan Llama-3.1-405B, 16384 H100 losing a node: {statistics.median(times):.2f} s median of {repeats} "
          f"(target 2 s); search {res.search.search_time_s:.2f} s; chosen {opt.ranked.plan.tp}/{opt.ranked.plan.pp}/"
          f"{opt.ranked.plan.dp} on {opt.ranked.cluster.n_gpus} GPUs, switch {opt.time.total_s:.2f} s; rank map "
          f"saves {saved:,.0f} GiB against torchrun's order")


def replan_command_speed(repeats: int) -> None:
    exe = shutil.which("meshplan") or str(Path(sys.executable).with_name("meshplan"))
    with tempfile.TemporaryDirectory() as tmp:
        plan = Path(tmp) / "405b.toml"
        subprocess.run([exe, "plan", "--model", "llama3.1-405b", "--gpus", "16384xh100-sxm", "--global-batch", "2048",
                        "--seq-len", "8192", "--out", str(plan)], check=True, capture_output=True)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            subprocess.run([exe, "replan", "--from", str(plan), "--lose-ranks", "8000-8007", "--remaining-steps",
                            "5000"], check=True, capture_output=True)
            times.append(time.perf_counter() - t0)
    print(f"meshplan replan end to end (start-up and preview included): {statistics.median(times):.2f} s median of "
          f"{repeats} (min {min(times):.2f}, max {max(times):.2f}; target 2 s)")


def main() -> int:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    anchors_table()
    replan_speed(repeats)
    replan_command_speed(max(repeats, 5))
    return 0


if __name__ == "__main__":
    sys.exit(main())
