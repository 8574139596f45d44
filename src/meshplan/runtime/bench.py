"""Micro-benchmarks of the local devices for ``meshplan calibrate``: GEMMs over shapes, the attention core,
memory bandwidth and collectives over process groups of each size the world allows.

Run on every rank at once (``python -m meshplan.runtime.bench OUT.json`` under torchrun, or alone) so compute
is measured under the same contention a training run sees: on a CPU, ranks share cores and memory. Rank 0
writes raw timings as JSON; ``meshplan.calibrate.local`` fits them into a hardware profile (no torch there).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F


@dataclass(frozen=True, kw_only=True)
class BenchSettings:
    """What to measure and for how long."""

    min_time_s: float = 0.05
    """Least total time per measured case (s); a case repeats until it has run this long."""
    gemm_sizes: tuple[tuple[int, int, int], ...] = (
        (64, 64, 64), (128, 128, 128), (256, 256, 256), (512, 512, 512), (1024, 1024, 1024),
        (2048, 256, 256), (2048, 1408, 256), (2048, 256, 704), (256, 2048, 2048), (4096, 64, 512),
        (32, 1024, 1024), (1024, 32, 1024))
    """(M, N, K) GEMM shapes: squares plus the skinny shapes of small decoders."""
    attention: tuple[int, int, int, int] = (2, 8, 256, 32)
    """(batch, heads, seq, head_dim) of the causal attention case (forward + backward)."""
    copy_bytes: int = 64 * 2**20
    """Buffer size of the copy-bandwidth test (bytes)."""
    collective_bytes: tuple[int, ...] = (4096, 65536, 2**20, 4 * 2**20, 16 * 2**20)
    """Buffer sizes of the collective tests (bytes)."""


GPU_SETTINGS = BenchSettings(
    min_time_s=0.05,
    gemm_sizes=((512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192),
                (8192, 2048, 2048), (8192, 8192, 2048), (8192, 2048, 8192), (4096, 14336, 4096),
                (4096, 4096, 14336), (16384, 1024, 4096), (2048, 28672, 8192)),
    attention=(2, 32, 4096, 128),
    copy_bytes=2**30,
    collective_bytes=(65536, 2**20, 16 * 2**20, 64 * 2**20, 256 * 2**20))
"""GPU-sized cases: CPU-sized GEMMs would time launch overhead, not the matrix units. Squares plus the
projections and MLPs of 1-70B decoders at 2-16k tokens, an 8B-class attention core at 4k, a 1 GiB copy."""


def settings_for(device: torch.device, min_time_s: float | None = None) -> BenchSettings:
    """The benchmark cases for the device kind, with ``min_time_s`` if given."""
    base = GPU_SETTINGS if device.type == "cuda" else BenchSettings()
    return base if min_time_s is None else replace(base, min_time_s=min_time_s)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, *, device: torch.device, min_time_s: float) -> float:
    """Median seconds per call of ``fn``: one warm-up call, then at least 3 calls and ``min_time_s`` in all."""
    fn()
    _sync(device)
    times: list[float] = []
    while len(times) < 3 or sum(times) < min_time_s:
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def bench_gemms(s: BenchSettings, *, device: torch.device, dtype: torch.dtype) -> list[list[float]]:
    """[m, n, k, seconds] per GEMM shape."""
    out = []
    for m, n, k in s.gemm_sizes:
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        out.append([m, n, k, timed(lambda: a @ b, device=device, min_time_s=s.min_time_s)])
    return out


def bench_attention(s: BenchSettings, *, device: torch.device, dtype: torch.dtype) -> dict:
    """Seconds of one causal scaled-dot-product attention forward, and of forward + backward."""
    b, h, n, d = s.attention
    q, k, v = (torch.randn(b, h, n, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    grad = torch.randn(b, h, n, d, device=device, dtype=dtype)

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def fwd_bwd():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)

    return {"shape": [b, h, n, d], "fwd_s": timed(fwd, device=device, min_time_s=s.min_time_s),
            "fwd_bwd_s": timed(fwd_bwd, device=device, min_time_s=s.min_time_s)}


def bench_copy(s: BenchSettings, *, device: torch.device) -> dict:
    """Seconds of one device-memory copy of ``copy_bytes`` (reads and writes that many bytes)."""
    x = torch.empty(s.copy_bytes // 4, device=device, dtype=torch.float32).fill_(1.0)
    y = torch.empty_like(x)
    return {"bytes": s.copy_bytes, "s": timed(lambda: y.copy_(x), device=device, min_time_s=s.min_time_s)}


def bench_op_overhead(*, device: torch.device) -> float:
    """Seconds of one tiny eager op (dispatch and launch overhead, the floor of every kernel)."""
    x = torch.ones(8, device=device)
    return timed(lambda: x.add_(1.0), device=device, min_time_s=0.02)


def bench_dtensor_overhead(*, device: torch.device) -> float:
    """Extra host seconds per op of a tensor-parallel layer, over the same work on plain tensors: a
    column-parallel linear (weight ``Shard(0)``, input ``Replicate``) forward + backward, whose three matmuls
    (forward, input and weight gradients) pay sharding propagation and subclass dispatch; divided by 3, the
    ops the cost model charges such a linear (``cost.compute.layer_compute``: backward = 2x forward ops). A
    cached elementwise op on a DTensor costs ~1/4 of this (13 vs 50-60 us, profile of a tp2 step)."""
    if not dist.is_initialized() or dist.get_world_size() < 2:
        return 0.0
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    world = dist.get_world_size()
    mesh = init_device_mesh(device.type, (world,))
    tokens, d_in, d_out = 32, 64, 64 * world
    w = torch.randn(d_out // world, d_in, device=device, requires_grad=True)
    x = torch.randn(tokens, d_in, device=device, requires_grad=True)
    g = torch.randn(tokens, d_out // world, device=device)
    wd = DTensor.from_local(w.detach(), mesh, [Shard(0)], run_check=False).requires_grad_()
    xd = DTensor.from_local(x.detach(), mesh, [Replicate()], run_check=False).requires_grad_()
    gd = DTensor.from_local(g, mesh, [Shard(1)], run_check=False)

    def plain():
        x.grad = w.grad = None
        F.linear(x, w).backward(g)

    def sharded():
        xd.grad = wd.grad = None
        F.linear(xd, wd).backward(gd)

    t_plain = timed(plain, device=device, min_time_s=0.05)
    t_sharded = timed(sharded, device=device, min_time_s=0.1)
    return max(t_sharded - t_plain, 0.0) / 3


HOST_STEP = {"model": "small-llama", "plan": {"global_batch": 8, "seq_len": 128, "micro_batch": 1,
                                               "precision": "bf16", "framework": "meshplan"},
             "framework": {"fused_optimizer": False}}
"""The tiny training step whose time on a GPU is the host's: 8 micro-batches of a 256-wide model."""


SYNC_STEP = {"model": "probe-llama", "plan": {"global_batch": 4, "seq_len": 192, "micro_batch": 2,
                                               "precision": "fp32", "sp": True, "framework": "meshplan"},
             "framework": {"fused_optimizer": False}}
"""The step that calibrates the synchronisation per blocking collective on CPUs: tensor + sequence parallel over
the whole world, ~16 blocking collectives per layer and micro-batch (tp = world is filled in)."""


def bench_sync_step(*, device: torch.device, warmup: int = 2, steps: int = 5) -> dict:
    """Fastest of ``steps`` TP+SP training steps of SYNC_STEP under the running process group (world >= 2): on
    shared CPU cores each blocking collective between compute waits for the peer's threads to be scheduled, a
    cost that a synthetic compute + all-reduce loop did not reproduce (0.03-1.4 ms there vs 2-5 ms per call in
    real steps: the peer's threads wake between real compute, not between back-to-back GEMMs).
    ``calibrate.local.fit_sync`` turns it into ``sync_s`` through the cost model's own count of calls."""
    plan = {**SYNC_STEP["plan"], **sync_degrees(dist.get_world_size())}
    return {**SYNC_STEP, "plan": plan, "s": _min_step({**SYNC_STEP, "plan": plan}, device, warmup, steps)}


def sync_degrees(world: int) -> dict:
    """tp as large as the world allows with the probe model's heads dividing (4 of its 6 heads do not), the rest
    data-parallel, so that the step fills every rank."""
    from meshplan import catalog
    from meshplan.spec.checks import plan_violations
    from meshplan.spec.plan import Plan

    spec = catalog.model(SYNC_STEP["model"])
    base = {k: v for k, v in SYNC_STEP["plan"].items() if k != "framework"}
    for tp in range(world, 0, -1):
        if world % tp:
            continue
        plan = Plan(**{**base, "sp": tp > 1, "tp": tp, "dp": world // tp})
        if not plan_violations(spec, catalog.cluster(f"{world}xcpu"), plan):
            return {"tp": tp, "dp": world // tp, "sp": tp > 1}
    return {"tp": 1, "dp": world, "sp": False}


def _min_step(step: dict, device: torch.device, warmup: int, steps: int) -> float:
    """Fastest of ``steps`` training steps (after ``warmup``) of the runtime's own trainer on ``step`` (model, plan
    and the runtime's stack settings), slowest rank's (``closed_loop``'s build and timed step, as ``meshplan
    check`` runs them)."""
    from meshplan import catalog
    from meshplan.runtime.closed_loop import build_plan_trainer, timed_step
    from meshplan.runtime.config import RUNTIME_STACK, RunConfig
    from meshplan.spec.plan_file import plan_from_dict

    cfg = RunConfig(plan=plan_from_dict(step["plan"]), model=step["model"],
                    stack=catalog.framework_with(RUNTIME_STACK, step.get("framework")))
    trainer = build_plan_trainer(cfg, device)
    return min(timed_step(trainer, i + 1)[0] for i in range(warmup + steps) if i >= warmup)


def bench_host_step(*, device: torch.device, warmup: int = 2, steps: int = 5) -> dict:
    """Fastest of ``steps`` training steps of the runtime's own trainer on HOST_STEP (one process, after
    ``warmup``): on a GPU the device idles through it, so ``calibrate.local.fit_host_op`` turns it into the host
    time per op. Only on a single-rank world (a GPU's host is what is measured)."""
    own = not dist.is_initialized()
    if own:
        backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        return {**HOST_STEP, "s": _min_step(HOST_STEP, device, warmup, steps)}
    finally:
        if own:
            dist.destroy_process_group()


def group_sizes(world: int) -> list[int]:
    """Process-group sizes to measure: powers of two from 2 up to the world."""
    out, n = [], 2
    while n <= world:
        out.append(n)
        n *= 2
    return out


def bench_collectives(s: BenchSettings, *, device: torch.device) -> dict:
    """{kind: {group size: [[bytes, seconds], ...]}} for all-reduce and all-gather over ranks 0..size-1."""
    world, rank = dist.get_world_size(), dist.get_rank()
    out: dict = {"all_reduce": {}, "all_gather": {}}
    for size in group_sizes(world):
        group = dist.new_group(list(range(size)))
        member = rank < size
        rows_ar, rows_ag = [], []
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in 2.12
        for nbytes in s.collective_bytes:
            buf = torch.ones(nbytes // 4, device=device)
            shards = torch.ones(nbytes // 4 // size, device=device)
            full = torch.empty(shards.numel() * size, device=device)
            if member:
                rows_ar.append([nbytes, _timed_collective(lambda: dist.all_reduce(buf, group=group), device, s)])
                rows_ag.append([nbytes, _timed_collective(
                    lambda: gather(full, shards, group=group), device, s)])
        out["all_reduce"][str(size)] = rows_ar
        out["all_gather"][str(size)] = rows_ag
        dist.barrier()
    return out


def _timed_collective(fn, device: torch.device, s: BenchSettings | None = None, *, calls: int = 15) -> float:
    """Median seconds of one call over a fixed count (every member calls the same number of times); the
    median shrugs off the scheduler hiccups of a loaded machine."""
    fn()
    _sync(device)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def run_benchmarks(s: BenchSettings, *, device: torch.device) -> dict:
    """Every benchmark on this rank; collectives only under an initialized process group."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    world = dist.get_world_size() if dist.is_initialized() else 1
    out = {"device": device.type, "device_name": torch.cuda.get_device_name(device) if device.type == "cuda"
           else "cpu", "dtype": "bf16" if dtype == torch.bfloat16 else "fp32", "world": world,
           "threads": torch.get_num_threads(),
           "memory_bytes": torch.cuda.get_device_properties(device).total_memory if device.type == "cuda"
           else _cpu_memory_bytes() // max(world, 1)}
    if world > 1:
        dist.barrier()
    out["op_overhead_s"] = bench_op_overhead(device=device)
    out["dtensor_overhead_s"] = bench_dtensor_overhead(device=device)
    out["gemm"] = bench_gemms(s, device=device, dtype=dtype)
    out["attention"] = bench_attention(s, device=device, dtype=dtype)
    out["copy"] = bench_copy(s, device=device)
    out["collectives"] = bench_collectives(s, device=device) if world > 1 else {}
    if device.type == "cpu" and world > 1:
        out["sync_step"] = bench_sync_step(device=device)
    if device.type == "cuda" and world == 1:
        out["host_step"] = bench_host_step(device=device)
    return out


def _cpu_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 * 2**30


def main(argv: list[str]) -> int:
    """``python -m meshplan.runtime.bench OUT.json [MIN_TIME_S]``: benchmark every rank, rank 0 writes OUT."""
    from meshplan.runtime.mesh import device_for

    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = device_for(int(os.environ.get("LOCAL_RANK", "0")))
    settings = settings_for(device, float(argv[1]) if len(argv) > 1 else None)
    if world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timedelta(seconds=120))
    try:
        result = run_benchmarks(settings, device=device)
        if world > 1:
            dist.barrier()
    finally:
        if world > 1:
            dist.destroy_process_group()
    if int(os.environ.get("RANK", "0")) == 0:
        Path(argv[0]).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    from meshplan.runtime.procs import die_with_parent

    die_with_parent()  # a rank never outlives its torchrun (or meshplan)
    sys.exit(main(sys.argv[1:]))
