"""Launching: validate a run before any process group exists, check that this host can hold it, spawn torchrun
(or run under it), and leave nothing behind.

``launch`` is what ``meshplan run`` calls: outside torchrun it validates the plan against ``--nproc`` and the model,
runs the host pre-flight (``runtime.host``), then starts ``torchrun --standalone`` on ``meshplan.runtime.worker``
as a supervised tree (``runtime.procs``: a stop signal or the wall timeout kills torchrun, every worker and
anything they started); inside torchrun it runs the worker directly.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from meshplan import catalog
from meshplan.errors import PlanError
from meshplan.runtime.config import RunConfig


def under_torchrun() -> bool:
    """This process was started by torchrun (or another torch elastic agent)."""
    return "TORCHELASTIC_RUN_ID" in os.environ or ("LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ)


def validate(cfg: RunConfig, world_size: int) -> None:
    """Raise PlanError/SpecError when the run cannot work: plan vs world size and model, runtime limits, data,
    and every live switch's plan and step. Imports only what planning needs, so it runs before
    torch.distributed starts anything."""
    from meshplan.runtime.data import Source
    from meshplan.runtime.models.decoder import check_supported

    spec = catalog.model(cfg.model)
    check_supported(spec)
    problems = plan_problems(spec, cfg, cfg.plan, world_size)
    if cfg.steps < 1:
        problems.append(f"steps={cfg.steps} must be >= 1")
    last = 0
    for step, plan, _ in cfg.switch_plans():
        where = f"switch at step {step}"
        if not 1 <= step < cfg.steps or step <= last:
            problems.append(f"{where}: the step must be after the previous switch and before the last step "
                            f"({cfg.steps}), so that the new layout trains at least one step")
        problems += [f"{where}: {p}" for p in plan_problems(spec, cfg, plan, world_size, subset=True)]
        last = step
    if problems:
        raise PlanError(dict.fromkeys(problems))  # the plan and stack checks may say the same thing
    Source(kind=cfg.data, vocab=spec.vocab, seed=cfg.seed).check(seq_len=cfg.plan.seq_len)
    for _, plan, _ in cfg.switch_plans():
        Source(kind=cfg.data, vocab=spec.vocab, seed=cfg.seed).check(seq_len=plan.seq_len)


def plan_problems(spec, cfg: RunConfig, plan, world_size: int, *, subset: bool = False) -> list[str]:
    """What keeps ``plan`` from running on ``world_size`` processes under this runtime, as sentences; ``subset``:
    a switch's target, which may leave ranks idle (its mesh takes the first n_gpus ranks)."""
    from meshplan.runtime.parallelize import check_runtime_support
    from meshplan.runtime.pipeline import pipeline_violations
    from meshplan.spec.checks import plan_violations, stack_violations

    problems = []
    if plan.n_gpus > world_size or (plan.n_gpus < world_size and not subset):
        problems.append(f"the plan needs tp*cp*pp*dp = {plan.tp}*{plan.cp}*{plan.pp}*{plan.dp} = {plan.n_gpus} "
                        f"processes, the world has {world_size}" + (" (a switch may use fewer)" if subset else ""))
    pools = cfg.pools if cfg.pools and plan.batch_shares else (plan.n_gpus,)
    if sum(pools) != plan.n_gpus:
        problems.append(f"the run's pools {'+'.join(map(str, pools))} hold {sum(pools)} GPUs, the plan "
                        f"{plan.n_gpus}")
        pools = (plan.n_gpus,)
    cluster = catalog.cluster("+".join(f"{n}xcpu" for n in pools))
    problems += [p for p in plan_violations(spec, cluster, plan) if "fp8" not in p]
    problems += check_runtime_support(spec, plan) + pipeline_violations(plan)
    problems += stack_violations(plan, cfg.stack) + unsupported_settings(cfg.stack)
    return problems


RUNTIME_SETTINGS = ("fused_optimizer",)
"""Stack settings the runtime can change: AdamW's foreach or per-tensor path (everything else is what it is)."""


def unsupported_settings(stack) -> list[str]:
    """Settings of the run's stack that differ from the runtime's preset and that it cannot honour, as sentences."""
    changes = stack.changes_from(catalog.framework(stack.name))
    return [f"{k}={v}: meshplan's runtime keeps {k}={getattr(catalog.framework(stack.name), k)}"
            for k, v in changes.items() if k not in RUNTIME_SETTINGS]


def torchrun_command(config_path: str, nproc: int) -> list[str]:
    """The torchrun command line that runs the worker on ``nproc`` local processes."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "--monitor-interval=0.2", "-m", "meshplan.runtime.worker", config_path]


def worker_env(nproc: int) -> dict:
    """The environment of a launch: torchrun's own default of one OpenMP thread per rank when several ranks
    share the host, set here so that torchrun does not print its banner about it."""
    env = dict(os.environ)
    if nproc > 1:
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def progress(text: str) -> None:
    """One line of progress on stderr (stdout carries the metrics)."""
    print(text, file=sys.stderr, flush=True)


def check_host(cfg: RunConfig, nproc: int, *, gpus_ref: str | None = None) -> str:
    """Refuse (HostLimit) a run this host cannot hold, before anything starts; returns what it will use."""
    from meshplan.runtime.host import device_note, preflight, probe_host

    host = probe_host()
    note = device_note(gpus_ref, host)
    if note:
        progress(note)
    return preflight(catalog.model(cfg.model), held_plans(cfg, host), cfg.stack, nproc=nproc, host=host)


def held_plans(cfg: RunConfig, host) -> list:
    """The plans whose trainers live at once at the run's peak: the plan alone, or at a live switch both layouts
    (the largest two of the run, conservatively)."""
    from meshplan.runtime.host import rank_build_bytes, rank_host_bytes

    plans = [cfg.plan] + [p for _, p, _ in cfg.switch_plans()]
    spec = catalog.model(cfg.model)
    size = (lambda p: rank_host_bytes(spec, p, cfg.stack)) if host.device == "cpu" else \
        (lambda p: rank_build_bytes(spec, p))
    return sorted(plans, key=size, reverse=True)[:2]


def prepare(cfg: RunConfig, *, nproc: int, gpus_ref: str | None = None) -> str:
    """Every check before a launch: the run (``validate``) and this host (``check_host``); returns what the run
    will use, for the progress line."""
    validate(cfg, nproc)
    return check_host(cfg, nproc, gpus_ref=gpus_ref)


def start(cfg: RunConfig, *, nproc: int, summary: str, timeout_s: float | None = None) -> int:
    """Start torchrun on a prepared run and wait; returns the exit status (0 on success, 124 at the wall
    timeout). A stop signal raises ``procs.Interrupted`` once every process is gone."""
    from meshplan.runtime.procs import run_tree

    limit = f", stopped after {timeout_s:g} s" if timeout_s else ""
    progress(f"run: {cfg.model}, {cfg.steps} steps on {summary}{limit}; starting torchrun")
    with tempfile.TemporaryDirectory(prefix="meshplan-run-") as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(cfg.to_json())
        done = run_tree(torchrun_command(str(path), nproc), timeout_s=timeout_s, env=worker_env(nproc))
    if done.timed_out:
        print(f"error: the run exceeded --wall-timeout {timeout_s:g} s (model build included) and was stopped "
              f"({done.stopped} processes killed)", file=sys.stderr)
        return 124
    return done.returncode if done.returncode >= 0 else 128 - done.returncode


def start_elastic(cfg: RunConfig, *, nproc: int, summary: str, restarts: int, timeout_s: float | None = None) -> int:
    """``start`` that survives killed ranks (``runtime.elastic``): each attempt's output is captured to find
    them, then printed."""
    from meshplan.runtime.elastic import run_elastic
    from meshplan.runtime.procs import run_tree

    progress(f"run: {cfg.model}, {cfg.steps} steps on {summary}; up to {restarts} restart(s) on the survivors")

    def once(c: RunConfig, world: int) -> tuple[int, str]:
        with tempfile.TemporaryDirectory(prefix="meshplan-run-") as tmp:
            path = Path(tmp) / "config.json"
            path.write_text(c.to_json())
            done = run_tree(torchrun_command(str(path), world), timeout_s=timeout_s, capture=True,
                            env=worker_env(world))
        sys.stdout.write(done.stdout or "")
        sys.stdout.flush()
        if done.timed_out:
            return 124, (done.stderr or "") + f"\nerror: the run exceeded --wall-timeout {timeout_s:g} s\n"
        return (done.returncode if done.returncode >= 0 else 128 - done.returncode), done.stderr or ""

    return run_elastic(cfg, nproc=nproc, restarts=restarts, timeout_s=timeout_s, start=once)


def launch(cfg: RunConfig, *, nproc: int, timeout_s: float | None = None, gpus_ref: str | None = None) -> int:
    """Run ``cfg`` on ``nproc`` processes (``prepare``, then ``start``); returns the exit status. ``gpus_ref``: the
    cluster the plan was made for (a note says when the runtime uses another device kind). Under torchrun, the
    worker runs in this process."""
    if under_torchrun():
        from meshplan.runtime.worker import worker_main

        return worker_main([cfg])
    summary = prepare(cfg, nproc=nproc, gpus_ref=gpus_ref)
    return start(cfg, nproc=nproc, summary=summary, timeout_s=timeout_s)
