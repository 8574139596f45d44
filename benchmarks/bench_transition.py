#!/usr/bin/env python
"""The transition model next to the published layout-switch anchors, and ``meshplan replan``'s answer time.

For each anchor: the bytes meshplan moves (busiest rank and in all), the rated-bandwidth bound, the calibrated
live time (transfer alone, as the anchors measure it with communicators built ahead, and with their set-up), the
checkpoint route, and the published figure. Layouts the sources do not publish are marked as our choice.
Then the replan speed target: Llama-3.1-405B on 16,384 H100 losing a node, under 2 s (median of repeats).

Usage: python benchmarks/bench_transition.py [repeats]"""

import statistics
import sys
import time

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


def main() -> int:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    anchors_table()
    replan_speed(repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
