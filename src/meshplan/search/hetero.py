"""Mixed-GPU clusters: which pools a plan uses and in which order they host the pipeline stages.

The cost model places pipeline rank r on the pool that holds global ranks [r n/pp, (r+1) n/pp), pools laid out
in order, so an order of pools is a pool-to-stage assignment. Leaving a pool idle is part of the space: every
non-empty subset of pools in every order is a variant, so adding GPUs never makes the chosen plan slower.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import permutations

from meshplan.spec.cluster import ClusterSpec

MAX_ORDERED_POOLS = 4
"""Beyond four pools the orders (n!) are cut to those sorted by speed, fastest or slowest first."""


def cluster_variants(cluster: ClusterSpec, *, precision: str, allow_idle: bool,
                     worlds: tuple[int, ...] = ()) -> list[ClusterSpec]:
    """Sub-clusters to plan on: the cluster itself first, then every ordered subset of pools that can run
    ``precision`` (mixed), or the first ``w`` GPUs for each smaller world size ``w`` asked for (homogeneous)."""
    if cluster.homogeneous:
        pool = cluster.pools[0]
        dom, der = pool.network()[0].span, cluster.derating
        # A smaller world idles the most derated scale-up domains first (Derating.idle).
        return [cluster] + [replace(cluster, pools=(replace(pool, n_gpus=w),), name=f"{w}x{pool.gpu.name}",
                                    derating=der.idle(pool.n_gpus, w, dom) if der else der)
                            for w in sorted(set(worlds), reverse=True) if w < pool.n_gpus]
    pools = [p for p in cluster.pools if p.gpu.peak_flops(precision) > 0]
    subsets = []
    n = len(pools)
    for mask in range(1, 1 << n):
        chosen = [pools[i] for i in range(n) if mask >> i & 1]
        if not allow_idle and len(chosen) < len(cluster.pools):
            continue
        if len(chosen) <= MAX_ORDERED_POOLS:
            orders = permutations(chosen)
        else:
            fast = sorted(chosen, key=lambda p: -p.gpu.peak_flops(precision))
            orders = [fast, fast[::-1]]
        subsets += [tuple(o) for o in orders]
    seen, out = set(), []
    for order in subsets:
        key = tuple(id(p) for p in order)
        if key not in seen:
            seen.add(key)
            out.append(replace(cluster, pools=order, derating=cluster.derating,
                               name="+".join(f"{p.n_gpus}x{p.gpu.name}" for p in order)))
    return out


def in_cluster_order(variant: ClusterSpec, cluster: ClusterSpec) -> bool:
    """The variant's pools appear in the cluster's order (one representative per subset of pools)."""
    idx = [next(i for i, p in enumerate(cluster.pools) if p is q) for q in variant.pools]
    return idx == sorted(idx)
