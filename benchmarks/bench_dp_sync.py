#!/usr/bin/env python
"""When a parameter-server layout wins: data-parallel Llama-3.2-1B (batch 64 x 2048) and Llama-3-8B (batch 128 x
2048, zero 0 needs 80 GB) on eight 8-GPU machines, ring all-reduce (meshplan's stack) against BytePS's push-pull
to CPU servers, over the machines' scale-out rate and the number of 100 Gb/s servers. Both stacks run torch kernels,
so the difference is the gradient synchronisation alone (``meshplan.cost.dp_sync``: BytePS Theorem 1).

Usage: python benchmarks/bench_dp_sync.py"""

from dataclasses import replace

from meshplan import catalog
from meshplan.cost.estimate import estimate
from meshplan.spec.io import cluster_from_dict
from meshplan.spec.plan import Plan

RATES_GBPS = (100, 400, 1600, 3200)
"""Scale-out bandwidth of one 8-GPU machine (Gb/s): cloud Ethernet to an HGX node's eight 400 Gb/s NICs."""
SERVERS = (0, 4, 8, 16)
"""CPU server machines of 100 Gb/s each."""
JOBS = (("llama3.2-1b", "a100-40gb", 64), ("llama3-8b", "a100-80gb", 128))


def cluster(gpu: str, node_gbps: float, servers: int):
    per_gpu = node_gbps / 8 / 8  # GB/s per GPU rail
    return cluster_from_dict({"pools": [{"gpu": gpu, "n_gpus": 64, "gpus_per_node": 8, "levels": [
        {"name": "nvlink", "span": 8, "bandwidth_gb_s": 300, "latency_us": 3},
        {"name": "fabric", "span": 64, "bandwidth_gb_s": per_gpu, "latency_us": 10}]}],
        "servers": {"count": servers, "bandwidth_gb_s": 12.5}}, catalog.gpu)


def main() -> int:
    for name, gpu, batch in JOBS:
        model = catalog.model(name)
        base = Plan(global_batch=batch, seq_len=2048, dp=64)
        print(f"\n{name} on 64x{gpu}, dp 64, batch {batch} x 2048: step s, all-reduce / BytePS with k servers "
              "(speedup)")
        print(f"{'machine Gb/s':>12s} {'all-reduce':>10s} " + " ".join(f"{'k=' + str(k):>14s}" for k in SERVERS))
        for rate in RATES_GBPS:
            ring = estimate(model, cluster(gpu, rate, 0), base.with_(framework="meshplan")).step_time
            cells = []
            for k in SERVERS:
                ps = estimate(model, cluster(gpu, rate, k), replace(base, framework="byteps", dp_sync="ps")).step_time
                cells.append(f"{ps:7.3f} ({ring / ps:4.2f}x)")
            print(f"{rate:12d} {ring:10.3f} " + " ".join(f"{c:>14s}" for c in cells))
    print("\nBytePS reaches M / B, half of all-reduce's 2(n-1)/n M / B, once the servers' bandwidth matches the "
          "GPU machines' (k servers x 100 Gb/s >= 8 machines x the machine rate); below that it interpolates.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
