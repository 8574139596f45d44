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
from dataclasses import dataclass

import numpy as np

from meshplan import catalog
from meshplan.cost.calib import gpu_calibration
from meshplan.cost.state_layout import geometry, state_groups, weights_only
from meshplan.cost.transition import Placement, transfer_bytes
from meshplan.cost.transition_time import SwitchCosts, new_groups, switch_time
from meshplan.search import SearchRequest
from meshplan.search.rankmap import choose_rank_map
from meshplan.search.replan import ClusterChange, ReplanRequest, replan
from meshplan.spec.io import parse_gpus
from meshplan.spec.plan import Plan

GB = 1e9


@dataclass(frozen=True)
class Anchor:
    name: str
    model: str
    gpu: str
    a: dict
    b: dict
    published: str
    source: str
    weights_only: bool = False


ANCHORS = (
    Anchor("DynaTrain 70B (layouts: our choice)", "llama3-70b", "h100-sxm", dict(tp=8, dp=8, zero=1),
           dict(tp=8, pp=2, dp=4, zero=1), "< 2 s", "arXiv 2605.18815 abstract"),
    Anchor("DynaTrain 70B TP<->DP swap (our choice)", "llama3-70b", "h100-sxm", dict(tp=8, dp=8, zero=1),
           dict(tp=4, dp=16, zero=1), "< 2 s", "arXiv 2605.18815 abstract"),
    Anchor("DynaTrain 235B MoE (layouts: our choice)", "qwen3-235b-a22b", "h100-sxm",
           dict(tp=4, pp=4, dp=16, ep=16, zero=1), dict(tp=4, pp=8, dp=8, ep=8, zero=1), "4.36 s",
           "arXiv 2605.18815 abstract"),
    Anchor("NeMo-RL DeepSeek-V3 refit PP16xEP16 -> TP32xDP8", "deepseek-v3", "h100-sxm",
           dict(pp=16, dp=16, ep=16, zero=1), dict(tp=32, dp=8, etp=32), "2.39-2.83 s",
           "NVIDIA-NeMo/RL docs/design-docs/nccl-reshard-refit.md", weights_only=True),
    Anchor("NeMo-RL Qwen3-30B refit EP8xPP2 -> TP8xDP2", "qwen3-30b-a3b", "h100-sxm",
           dict(pp=2, dp=8, ep=8, zero=1), dict(tp=8, dp=2, etp=8), "0.74-1.00 s",
           "NVIDIA-NeMo/RL docs/design-docs/nccl-reshard-refit.md", weights_only=True),
    Anchor("ElasticMegatron Qwen3-30B-A3B TP4 EP4, 8 -> 4 GPUs", "qwen3-30b-a3b", "a100-80gb",
           dict(tp=4, dp=2, ep=4, zero=1), dict(tp=4, dp=1, ep=4, zero=1), "42.2 GB in 32.8 s (CPU Adam)",
           "ElasticMegatron docs/cpu_adam_reshard_optimization/baseline.md"),
)


def price(anchor: Anchor, costs: SwitchCosts) -> dict:
    model = catalog.model(anchor.model)
    stack = catalog.framework("megatron-core")
    pa = Plan(global_batch=256, seq_len=4096, **anchor.a)
    pb = Plan(global_batch=256, seq_len=4096, **anchor.b)
    cluster = parse_gpus(f"{pa.n_gpus}x{anchor.gpu}", catalog.gpu)
    pool = cluster.pools[0]
    domain = pool.network()[0].span
    ga, gb = geometry(model, pa, stack), geometry(model, pb, stack)
    if anchor.weights_only:
        gb = weights_only(gb)
    tensors = state_groups(model)
    usable = np.arange(pa.n_gpus)
    lost = np.array([], dtype=np.int64)  # planned switches: GPUs that leave a shrink send before they go
    rmap = choose_rank_map(ga, np.arange(pa.n_gpus), gb, usable=usable, lost=lost, domain=domain, tensors=tensors)
    x = transfer_bytes(Placement(ga, np.arange(pa.n_gpus)), Placement(gb, rmap.phys), tensors=tensors,
                       lost_gpus=lost, domain=domain)
    t = switch_time(x, phys_b=rmap.phys, pool=pool, calib=gpu_calibration(pool.gpu), costs=costs,
                    new_groups=new_groups(pb))
    return {"moved_gb": x.moved / GB, "max_in_gb": float((x.in_local + x.in_fabric).max()) / GB, "time": t}


def anchors_table() -> None:
    costs = SwitchCosts()
    print(f"{'anchor':50s} {'moved GB':>9s} {'in/rank':>8s} {'bound s':>8s} {'live s':>7s} {'+groups':>8s} "
          f"{'ckpt s':>7s}  published")
    for anchor in ANCHORS:
        r = price(anchor, costs)
        t = r["time"]
        print(f"{anchor.name:50s} {r['moved_gb']:9.1f} {r['max_in_gb']:8.2f} {t.bound_s:8.2f} {t.transfer_s:7.2f} "
              f"{t.total_s:8.2f} {t.checkpoint_s:7.0f}  {anchor.published}  [{anchor.source}]")
    print("live s: transfer at the achieved link bandwidth with communicators built ahead (as the anchors run); "
          "+groups: with their set-up on the switch's path")


def replan_speed(repeats: int) -> None:
    model = catalog.model("llama3.1-405b")
    cluster = parse_gpus("16384xh100-sxm", catalog.gpu)
    plan = Plan(global_batch=2048, seq_len=8192, tp=8, sp=True, pp=16, vpp=8, dp=128, zero=1)
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
