"""Closing the loop: enumerate the feasible plans of a local world, time each for real, score the predictions.

Torch-free parts (enumeration, agreement metrics) import nothing heavy, so ``meshplan check`` can plan before
any worker starts. The worker (``python -m meshplan.runtime.closed_loop CONFIGS.json OUT.json`` under
torchrun) builds every plan's trainer once in one process group, then runs *rounds*: one step of each plan per
round, in turn. Interleaving spreads slow phases of a shared, noisy machine over all plans instead of
penalizing whichever plan happened to run then.

Which number is a plan's "device time" on a shared CPU: other tenants' load only ever *adds* wall time (a
rank descheduled mid-step), so the fastest of several interleaved rounds (``min``) is the best estimate of
the unloaded machine, as timeit does; the median (``median``) is kept for comparison. Per-rank CPU time
(``process_time``) is recorded too but not used to rank: it is blind to pipeline bubbles and to waiting on
a peer's collective, which are real step time a dedicated device would also spend.
"""

from __future__ import annotations

import json
import os
import sys
import time
from itertools import product
from pathlib import Path

from meshplan import catalog
from meshplan.calibrate.agreement import CheckSpace
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import Plan
from meshplan.spec.schedules import schedule_spec


def _factorizations(world: int) -> list[tuple[int, int, int]]:
    """(tp, pp, dp) with tp * pp * dp == world."""
    return [(t, p, world // (t * p)) for t in range(1, world + 1) for p in range(1, world + 1)
            if world % (t * p) == 0]


def layouts(space: CheckSpace) -> list[dict]:
    """Plan fields of every layout: degrees, sharding, sequence parallelism and pipeline schedule."""
    out = []
    for tp, pp, dp in _factorizations(space.world):
        zeros = (0, 3) if dp > 1 else (0,)
        sps = (True, False) if tp > 1 else (False,)
        scheds = tuple((s, schedule_spec(s).chunks[0]) for s in space.schedules) if pp > 1 else (("", 1),)
        for zero, sp, (sched, vpp) in product(zeros, sps, scheds):
            out.append(dict(tp=tp, pp=pp, dp=dp, zero=zero, sp=sp, schedule=sched, vpp=vpp))
    return out


def _micro_batches(space: CheckSpace, dp: int, pp: int) -> tuple[int, ...]:
    if space.micro_batches:
        return space.micro_batches
    local = space.global_batch // dp
    biggest = local // pp if pp > 1 else local  # a pipeline needs n_micro >= pp
    return tuple(sorted({max(biggest, 1), max(biggest // 2, 1)}, reverse=True))


def enumerate_plans(model: ModelSpec, space: CheckSpace) -> list[Plan]:
    """Every plan of ``space`` the planner's rules and the runtime accept, in a stable order."""
    from meshplan.runtime.parallelize import check_runtime_support
    from meshplan.spec.checks import plan_violations

    cluster = catalog.cluster(f"{space.world}xcpu")
    out = []
    for lay in layouts(space):
        for mb, rc in product(_micro_batches(space, lay["dp"], lay["pp"]), space.recompute):
            try:
                plan = Plan(global_batch=space.global_batch, seq_len=space.seq_len, micro_batch=mb,
                            recompute=rc, precision=space.precision, framework=space.stack.name, **lay)
            except Exception:  # noqa: BLE001 - an invalid combination is simply not a plan
                continue
            if plan_violations(model, cluster, plan) or check_runtime_support(model, plan) or \
                    _pipeline_problems(plan):
                continue
            out.append(plan)
    return out


def _pipeline_problems(plan: Plan) -> list[str]:
    if plan.pp == 1:
        return []
    from meshplan.runtime.pipeline import pipeline_violations

    return pipeline_violations(plan)


def covering(plans: list[Plan]) -> list[Plan]:
    """A small subset that still covers every kind: each layout at its largest micro-batch without recompute,
    every recompute mode and the smaller micro-batch on the first FSDP and the first TP layout (on the only
    layout of a one-device world)."""
    def layout_key(p: Plan) -> tuple:
        return (p.tp, p.pp, p.dp, p.zero, p.sp, p.schedule, p.vpp)

    biggest: dict[tuple, int] = {}
    for p in plans:
        biggest[layout_key(p)] = max(biggest.get(layout_key(p), 0), p.micro_batch)
    varied = [k for k in biggest if (k[3] == 3 and k[0] == 1) or (k[0] > 1 and k[4])][:2] or list(biggest)[:1]
    out = []
    for p in plans:
        base = p.micro_batch == biggest[layout_key(p)] and p.recompute == "none"
        variant = layout_key(p) in varied and (p.micro_batch == biggest[layout_key(p)] or p.recompute == "none")
        if base or variant:
            out.append(p)
    return out


def plan_label(p: Plan) -> str:
    """Short readable name of a plan, e.g. ``fsdp2 mb4 rc=full`` or ``pp2 1f1b mb2``."""
    parts = []
    if p.dp > 1:
        parts.append(f"{'fsdp' if p.zero == 3 else 'dp'}{p.dp}")
    if p.tp > 1:
        parts.append(f"tp{p.tp}{'+sp' if p.sp else ''}")
    if p.pp > 1:
        parts.append(f"pp{p.pp} {p.schedule_name}" + (f" vpp{p.vpp}" if p.vpp > 1 else ""))
    parts.append(f"mb{p.micro_batch}")
    if p.recompute != "none":
        parts.append(f"rc={p.recompute}")
    return " ".join(parts)


# ---------------------------------------------------------------- worker (torch from here on, lazily)
def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2] if len(s) % 2 else 0.5 * (s[len(s) // 2 - 1] + s[len(s) // 2])


def time_plans(cfgs: list, *, warmup: int, rounds: int, device=None) -> dict:
    """Time every config under the running process group: ``{"times", "cpu_times", "peak_bytes"}``, each plan's
    measured wall and CPU step times (s, slowest rank) and, on a GPU, its peak allocated bytes (max over ranks).

    On a CPU all trainers are built first and run in interleaved rounds (one step of each plan per round), so a
    shared machine's slow phases spread over every plan. On a GPU the device is dedicated and memory is the
    limit, so plans run one after another, each alone on the device: built, warmed up, timed, freed; its peak is
    then its own (``torch.cuda.max_memory_allocated`` after a reset)."""
    import torch

    device = device or torch.device("cpu")
    if device.type == "cuda":
        return _time_sequential(cfgs, warmup=warmup, rounds=rounds, device=device)
    start = time.perf_counter()
    trainers = [build_plan_trainer(c, device) for c in cfgs]
    _say(f"built {len(cfgs)} trainers in {time.perf_counter() - start:.1f} s")
    times: list[list[float]] = [[] for _ in cfgs]
    cpu: list[list[float]] = [[] for _ in cfgs]
    for r in range(warmup + rounds):
        start = time.perf_counter()
        for i, t in enumerate(trainers):
            wall, cpu_s = timed_step(t, r + 1)
            if r >= warmup:
                times[i].append(wall)
                cpu[i].append(cpu_s)
        kind = "warm-up" if r < warmup else "measured"
        _say(f"round {r + 1}/{warmup + rounds} ({kind}) in {time.perf_counter() - start:.1f} s")
    return {"times": times, "cpu_times": cpu, "peak_bytes": [None] * len(cfgs)}


def _say(text: str) -> None:
    """Rank 0's progress line on stderr."""
    import torch.distributed as dist

    if dist.get_rank() == 0:
        print(f"[check] {text}", file=sys.stderr, flush=True)


def build_plan_trainer(cfg, device):
    """The trainer of one RunConfig on ``device`` under the running process group, its meshes built."""
    from meshplan import catalog
    from meshplan.runtime.build import build_trainer
    from meshplan.runtime.mesh import build_meshes

    return build_trainer(cfg, catalog.model(cfg.model), build_meshes(cfg.plan, device.type), device)


def timed_step(trainer, step: int) -> tuple[float, float]:
    """(wall s, CPU s) of one training step, the slowest rank's."""
    import torch
    import torch.distributed as dist

    from meshplan.runtime.train import train_step

    dist.barrier()
    row = train_step(trainer, step)
    dt = torch.tensor([row["step_time_s"], row["cpu_time_s"]], device=trainer.device)
    dist.all_reduce(dt, op=dist.ReduceOp.MAX)
    return float(dt[0]), float(dt[1])


def _time_sequential(cfgs: list, *, warmup: int, rounds: int, device) -> dict:
    """One plan at a time on a dedicated device; the peak is the plan's own."""
    import gc

    import torch
    import torch.distributed as dist

    times, cpu, peaks = [], [], []
    for i, cfg in enumerate(cfgs):
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        trainer = build_plan_trainer(cfg, device)
        built = time.perf_counter() - start
        rows = [timed_step(trainer, s + 1) for s in range(warmup + rounds)][warmup:]
        peak = torch.tensor([float(torch.cuda.max_memory_allocated(device))], device=device)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        times.append([w for w, _ in rows])
        cpu.append([c for _, c in rows])
        peaks.append(float(peak))
        del trainer
        if dist.get_rank() == 0:  # progress: a long GPU check shows where it is
            print(f"[check] {i + 1}/{len(cfgs)} {plan_label(cfg.plan)}: built in {built:.1f} s, steps "
                  f"{', '.join(f'{w:.3f}' for w, _ in rows)} s (cpu {min(c for _, c in rows):.3f}), peak "
                  f"{float(peak) / 2**30:.2f} GiB", file=sys.stderr, flush=True)
    return {"times": times, "cpu_times": cpu, "peak_bytes": peaks}


def main(argv: list[str]) -> int:
    """``closed_loop CONFIGS.json OUT.json WARMUP ROUNDS [cuda]``: time every config (on this rank's GPU when
    ``cuda`` is given, else the CPU); rank 0 writes the step times and peaks."""
    from datetime import timedelta

    import torch.distributed as dist

    from meshplan.runtime.launch import validate
    from meshplan.runtime.mesh import device_for
    from meshplan.runtime.worker import read_configs

    cfgs = read_configs(argv[0])
    warmup, rounds = int(argv[2]), int(argv[3])
    device = device_for(int(os.environ.get("LOCAL_RANK", "0"))) if argv[4:] == ["cuda"] else None
    world = int(os.environ.get("WORLD_SIZE", "1"))
    for c in cfgs:
        validate(c, world)
    backend = "cpu:gloo,cuda:nccl" if device is not None and device.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=min(c.timeout_s for c in cfgs)))
    try:
        out = time_plans(cfgs, warmup=warmup, rounds=rounds, device=device)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if int(os.environ.get("RANK", "0")) == 0:
        times, cpu = out["times"], out["cpu_times"]
        Path(argv[1]).write_text(json.dumps({**out, "median_s": [_median(t) for t in times],
                                             "min_s": [min(t) for t in times],
                                             "cpu_median_s": [_median(t) for t in cpu]}))
    return 0


if __name__ == "__main__":
    from meshplan.runtime.procs import die_with_parent

    die_with_parent()  # a rank never outlives its torchrun (or meshplan)
    sys.exit(main(sys.argv[1:]))
