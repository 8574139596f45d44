#!/usr/bin/env python
"""When a parameter-server layout wins: data-parallel Llama-3.2-1B (batch 64 x 2048) and Llama-3-8B (batch 128 x
2048, zero 0 needs 80 GB) on eight 8-GPU machines, ring all-reduce (meshplan's stack) against BytePS's push-pull
to CPU servers, over the machines' scale-out rate and the number of 100 Gb/s servers. Both stacks run torch kernels,
so the difference is the gradient synchronisation alone (``meshplan.cost.dp_sync``: BytePS Theorem 1). Then
Stanza's layer separation of the same jobs (``meshplan.cost.layer_separation``): the best number of dense workers
holding the embedding and output head, against every GPU training the whole model.

Usage: python benchmarks/bench_dp_sync.py"""

from dataclasses import replace

from meshplan import catalog
from meshplan.cost.estimate import estimate
from meshplan.cost.layer_separation import best_separation
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
    separation()
    return 0


SEPARATION_JOBS = (("llama3.2-1b", "a100-40gb", 64), ("qwen2.5-7b", "a100-80gb", 64))
"""A small model whose tied 128k-token embedding is 21 % of its parameters, and one whose untied 152k-token
embedding and head are 14 %."""


def separation() -> None:
    stack = catalog.framework("meshplan")
    print("\nLayer separation (Stanza): m of the 64 GPUs hold the embedding and output head; step s against all 64 "
          "training the whole model (no memory limit: the comparison is of time)")
    print(f"{'model':>12s} {'machine Gb/s':>12s} {'whole':>8s} {'separated':>10s} {'m':>3s} {'paced by':>14s} "
          f"{'speedup':>8s}")
    for name, gpu, batch in SEPARATION_JOBS:
        model = catalog.model(name)
        base = Plan(global_batch=batch, seq_len=2048, dp=64, framework="meshplan")
        for rate in (25,) + RATES_GBPS:
            clu = cluster(gpu, rate, 0)
            whole = estimate(model, clu, base).step_time
            sep = best_separation(model, clu, base, stack=stack, limit=4.0)
            print(f"{name:>12s} {rate:12d} {whole:8.3f} {sep.step_time:10.3f} {sep.dense_workers:3d} {sep.bound:>14s} "
                  f"{whole / sep.step_time:7.2f}x")
    print("It pays only where the all-reduce dominates (the vocabulary's share of the gradients leaves the ring) "
          "and the head's work, 3-7 % of a token's FLOPs, fits on the few dense workers; elsewhere the GPUs taken "
          "from the blocks cost more than the traffic saved.")


if __name__ == "__main__":
    raise SystemExit(main())
