"""The training loop: one optimizer step per global batch, JSON-lines metrics, checkpoints, profiling.

Also the single-process reference (``reference_losses``): the same model, data and optimizer with no parallelism,
which every layout's losses must match in fp32.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from meshplan import catalog
from meshplan.runtime import checkpoint
from meshplan.runtime.build import (
    Trainer,
    build_trainer,
    loss_context,
    loss_fn,
    sync_grads,
)
from meshplan.runtime.config import RunConfig
from meshplan.runtime.data import Source, replica_rows
from meshplan.runtime.mesh import build_meshes
from meshplan.runtime.models.decoder import build_decoder
from meshplan.spec.checks import replica_shares


def clip_grads(params: list[torch.nn.Parameter], *, max_norm: float, pp_group=None,
               duplicates: tuple[torch.nn.Parameter, ...] = ()) -> float:
    """Global gradient L2 norm over every shard and pipeline stage; scale gradients down to max_norm (0 = only
    measure). DTensor gradients are grouped by mesh so each group's norm is reduced over its own axes.
    ``duplicates`` (copies of parameters counted elsewhere, e.g. a tied embedding's second copy) are scaled but
    not counted."""
    buckets: dict = {}
    plain = []
    dup = {id(p) for p in duplicates}
    for p in params:
        if p.grad is None or id(p) in dup:
            continue
        if isinstance(p.grad, DTensor):
            buckets.setdefault(p.grad.device_mesh, []).append(p.grad)
        else:
            plain.append(p.grad)
    first = next(iter(buckets.values()))[0] if buckets else plain[0]
    sq = torch.zeros((), device=first.device, dtype=torch.float32)
    for grads in buckets.values():
        n = torch.nn.utils.get_total_norm(grads, foreach=False)
        sq += (n.full_tensor() if isinstance(n, DTensor) else n).float() ** 2
    if plain:
        sq += torch.nn.utils.get_total_norm(plain, foreach=False).float() ** 2
    if pp_group is not None:
        dist.all_reduce(sq, group=pp_group)
    total = float(sq.sqrt())
    if max_norm > 0 and total > max_norm:
        coef = max_norm / (total + 1e-6)
        for grads in list(buckets.values()) + [plain, [p.grad for p in duplicates if p.grad is not None]]:
            for g in grads:
                g.mul_(coef)
    return total


def _local_batch(t: Trainer, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    plan = t.cfg.plan
    src = Source(kind=t.cfg.data, vocab=t.spec.vocab, seed=t.cfg.seed)
    x, y = src.batch(step=step, batch=plan.global_batch, seq_len=plan.seq_len)
    rows = replica_rows(replica_shares(plan, t.cfg.pool_sizes()), dp_rank=t.meshes.rank_in("dp"),
                        micro_batch=plan.micro_batch)
    x, y = x[rows], y[rows]
    pos = t.positions.cpu()
    return x[:, pos].to(t.device), y[:, pos].to(t.device)


def _forward_backward(t: Trainer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Sum of micro-batch losses / n_micro (times dp * n_micro / n_micro_total under uneven shares) on ranks
    holding the last stage, else 0; gradients accumulated."""
    with loss_context(t):
        return _micro_batches(t, x, y)


def _micro_batches(t: Trainer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    plan = t.cfg.plan
    if t.schedule is not None:
        losses: list[torch.Tensor] = []
        args = (x,) if 0 in t.stage_ids else ()
        holds_last = plan.n_stages - 1 in t.stage_ids
        t.schedule.step(*args, target=y if holds_last else None, losses=losses)
        if holds_last:
            stacked = torch.stack([loss.detach().float() for loss in losses])
            return stacked.mean() if t.micro_weight is None else stacked.sum()  # weighted losses add up
        return torch.zeros((), device=t.device)
    part, n = t.parts[0], t.n_micro
    total = torch.zeros((), device=t.device)
    for i, (xm, ym) in enumerate(zip(x.chunk(n), y.chunk(n))):
        if hasattr(part, "set_requires_gradient_sync"):
            part.set_requires_gradient_sync(i == n - 1)
        loss = loss_fn(part(xm), ym)
        loss = loss / n if t.micro_weight is None else loss * t.micro_weight
        loss.backward()
        total += loss.detach().float()
    return total


def train_step(t: Trainer, step: int) -> dict | None:
    """One optimizer step; returns the metrics row (loss is the global-batch mean), None on an idle rank."""
    plan = t.cfg.plan
    if not t.meshes.active:
        return None
    x, y = _local_batch(t, step)
    for opt in t.optimizers:
        opt.zero_grad(set_to_none=True)
    start, cpu_start = time.perf_counter(), time.process_time()
    local = _forward_backward(t, x, y)
    sync_grads(t)
    params = [p for part in t.parts for p in part.parameters()]
    pp_group = t.meshes.axis("pp").get_group() if plan.pp > 1 else None
    norm = clip_grads(params, max_norm=t.cfg.max_norm, pp_group=pp_group,
                      duplicates=t.tied.duplicate if t.tied is not None else ())
    for opt in t.optimizers:
        opt.step()
    dist.all_reduce(local, group=t.meshes.group)
    if t.device.type == "cuda":
        torch.cuda.synchronize()
    dt, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    loss = float(local) / (plan.dp * plan.cp * plan.tp)
    peak = torch.cuda.max_memory_allocated() if t.device.type == "cuda" else None
    row = {"step": step, "loss": loss, "grad_norm": norm, "step_time_s": dt, "cpu_time_s": cpu,
           "tokens_per_s": plan.global_batch * plan.seq_len / dt, "peak_memory_bytes": peak}
    if plan.batch_shares:
        row["replica_sequences"] = _replica_sequences(t, x.shape[0])
    return row


def _replica_sequences(t: Trainer, n: int) -> list[int]:
    """Sequences each data-parallel replica trained this step, as its first tp/cp/pp rank counted them."""
    counts = torch.zeros(t.cfg.plan.dp, dtype=torch.long, device=t.device)
    if all(t.meshes.rank_in(a) == 0 for a in ("tp", "cp", "pp")):
        counts[t.meshes.rank_in("dp")] = n
    dist.all_reduce(counts, group=t.meshes.group)
    return counts.tolist()


class _Metrics:
    """Rank 0 writes each row as one JSON line on stdout and to out_dir/metrics.jsonl."""

    def __init__(self, cfg: RunConfig, rank: int):
        self.rank = rank
        self.path = Path(cfg.out_dir) / "metrics.jsonl" if cfg.out_dir and rank == 0 else None
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def emit(self, row: dict) -> None:
        if self.rank != 0:
            return
        line = json.dumps(row)
        print(line, flush=True)
        if self.path:
            with self.path.open("a") as f:
                f.write(line + "\n")


def _profiled(cfg: RunConfig, step: int, device: torch.device):
    if step not in cfg.profile_steps:
        return contextlib.nullcontext()
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    return profile(activities=acts, record_shapes=False)


def _summary(rows: list[dict], cfg: RunConfig, start_step: int) -> dict:
    timed = rows[1:] or rows
    mean_t = sum(r["step_time_s"] for r in timed) / max(len(timed), 1)
    peaks = [r["peak_memory_bytes"] for r in rows if r["peak_memory_bytes"] is not None]
    return {"summary": True, "steps": len(rows), "start_step": start_step,
            "first_loss": rows[0]["loss"] if rows else None, "final_loss": rows[-1]["loss"] if rows else None,
            "mean_step_time_s": mean_t, "tokens_per_s": cfg.plan.global_batch * cfg.plan.seq_len / mean_t
            if mean_t else None, "peak_memory_bytes": max(peaks) if peaks else None,
            "compute_dtype": "bf16" if cfg.plan.precision == "bf16" and torch.cuda.is_available() else "fp32",
            "mixed_precision": "fsdp2 MixedPrecisionPolicy(bf16 params, fp32 reduce)"
            if cfg.plan.precision == "bf16" and torch.cuda.is_available() else "none",
            **cfg.extra}


def _progress(text: str) -> None:
    """Rank 0's progress before the first step, on stderr (stdout carries the metrics)."""
    print(f"[run] {text}", file=sys.stderr, flush=True)


def run(cfg: RunConfig, device: torch.device) -> list[dict]:
    """Train under an initialized process group; returns the metrics rows plus the summary (on every rank)."""
    spec = catalog.model(cfg.model)
    rank = dist.get_rank()
    say = _progress if rank == 0 else (lambda text: None)
    say(f"building {spec.name} ({spec.n_layers} layers) on {dist.get_world_size()} {device.type} ranks")
    began = time.perf_counter()
    meshes = build_meshes(cfg.plan, device.type)
    t = build_trainer(cfg, spec, meshes, device)
    built = time.perf_counter() - began
    start = checkpoint.maybe_resume(t) if cfg.resume else 0
    resumed = time.perf_counter() - began - built
    say(f"built in {time.perf_counter() - began:.1f} s" + (f", resumed at step {start}" if start else "") +
        f"; training steps {start + 1}..{cfg.steps}")
    metrics, rows = _Metrics(cfg, rank), []
    switches = {s: (plan, opts) for s, plan, opts in cfg.switch_plans() if s > start}
    for step in range(start + 1, cfg.steps + 1):
        if step == cfg.fail_at_step and rank == min(1, dist.get_world_size() - 1):
            os.kill(os.getpid(), signal.SIGKILL)
        profiling = step in cfg.profile_steps
        if profiling:
            # Start and stop the profiler while no collective is in flight on any rank: starting or stopping
            # it under a peer's pending gloo call aborted a CPU run once ("terminate called without an
            # active exception").
            dist.barrier()
        with _profiled(cfg, step, device) as prof:
            row = train_step(t, step)
            if profiling:
                dist.barrier()
        if prof is not None and cfg.out_dir:
            prof.export_chrome_trace(str(Path(cfg.out_dir) / f"trace-step{step}-rank{rank}.json"))
        every = cfg.checkpoint_every
        if cfg.checkpoint_dir and ((every and step % every == 0) or step == cfg.steps):
            saving = time.perf_counter()
            checkpoint.save(t, step)
            if row is not None:
                row["checkpoint_s"] = time.perf_counter() - saving
        if row is not None:  # an idle rank (outside a shrunk layout) trains nothing and writes nothing
            rows.append(row)
            metrics.emit(row)
        if step in switches:
            from meshplan.runtime.switch import run_switch

            t, row = run_switch(t, step, *switches[step])
            metrics.emit(row)
    summary = {**_summary(rows, cfg, start), "build_s": built, "resume_s": resumed}
    metrics.emit(summary)
    return rows + [summary]


def reference_rows(cfg: RunConfig) -> list[dict]:
    """Per-step ``loss`` (global-batch mean) and ``grad_norm`` (before clipping) of the same run in one process,
    without any parallelism (fp32)."""
    spec = catalog.model(cfg.model)
    model = build_decoder(spec, seed=cfg.seed, max_seq_len=cfg.plan.seq_len)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            foreach=False)
    src = Source(kind=cfg.data, vocab=spec.vocab, seed=cfg.seed)
    out = []
    for step in range(1, cfg.steps + 1):
        x, y = src.batch(step=step, batch=cfg.plan.global_batch, seq_len=cfg.plan.seq_len)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        norm = clip_grads(list(model.parameters()), max_norm=cfg.max_norm)
        opt.step()
        out.append({"loss": float(loss.detach()), "grad_norm": norm})
    return out


def reference_losses(cfg: RunConfig) -> list[float]:
    """Per-step global-batch losses of the same run in one process, without any parallelism (fp32)."""
    return [r["loss"] for r in reference_rows(cfg)]
