#!/usr/bin/env python
"""Estimates per second of the cost model: GPT-3 175B on 1024 A100-80GB, 1F1B, pp 8 (the core issue's
figure; the planner needs thousands per second). Prints medians over repeats; no assertion."""

import statistics
import time

from meshplan import catalog
from meshplan.cost.estimate import estimate
from meshplan.spec.plan import Plan


def rate(model, cluster, plan, *, seconds: float = 1.0) -> float:
    """Estimates per second over about ``seconds`` of wall time."""
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        estimate(model, cluster, plan)
        n += 1
    return n / (time.perf_counter() - t0)


def main() -> None:
    model, cluster = catalog.model("gpt3-175b"), catalog.cluster("1024xa100-80gb")
    cases = {
        "gpt3-175b 1024xa100 tp8 pp8 1f1b": Plan(global_batch=1536, seq_len=2048, tp=8, sp=True, pp=8, dp=16,
                                                  zero=1, recompute="full"),
        "gpt3-175b 1024xa100 tp8 pp8 vpp6": Plan(global_batch=1536, seq_len=2048, tp=8, sp=True, pp=8, vpp=6,
                                                  dp=16, zero=1),
        "gpt3-175b 1024xa100 tp8 dp128 fsdp": Plan(global_batch=1536, seq_len=2048, tp=8, sp=True, dp=128, zero=3,
                                                    recompute="full"),
    }
    for name, plan in cases.items():
        runs = [rate(model, cluster, plan, seconds=0.5) for _ in range(5)]
        print(f"{name:40s} {statistics.median(runs):8.0f} estimates/s (median of 5; min {min(runs):.0f})")


if __name__ == "__main__":
    main()
