"""Launching: validate a run before any process group exists, spawn torchrun (or run under it), and shut down
cleanly.

``launch`` is what ``meshplan run`` calls: outside torchrun it validates the plan against ``--nproc`` and the model,
then starts ``torchrun --standalone`` on ``meshplan.runtime.worker``; inside torchrun it runs the worker directly.
"""

from __future__ import annotations

import os
import subprocess
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
    """Raise PlanError/SpecError when the run cannot work: plan vs world size and model, runtime limits, data.
    Imports only what planning needs, so it runs before torch.distributed starts anything."""
    from meshplan.runtime.data import Source
    from meshplan.runtime.models.decoder import check_supported
    from meshplan.runtime.parallelize import check_runtime_support
    from meshplan.runtime.pipeline import pipeline_violations
    from meshplan.spec.checks import plan_violations, stack_violations

    spec = catalog.model(cfg.model)
    check_supported(spec)
    plan = cfg.plan
    problems = []
    if plan.n_gpus != world_size:
        problems.append(f"the plan needs tp*cp*pp*dp = {plan.tp}*{plan.cp}*{plan.pp}*{plan.dp} = {plan.n_gpus} "
                        f"processes, the world has {world_size}")
    cluster = catalog.cluster(f"{plan.n_gpus}xcpu")
    problems += [p for p in plan_violations(spec, cluster, plan) if "fp8" not in p]
    problems += check_runtime_support(spec, plan) + pipeline_violations(plan)
    problems += stack_violations(plan, cfg.stack) + unsupported_settings(cfg.stack)
    if cfg.steps < 1:
        problems.append(f"steps={cfg.steps} must be >= 1")
    if problems:
        raise PlanError(problems)
    Source(kind=cfg.data, vocab=spec.vocab, seed=cfg.seed)


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


def launch(cfg: RunConfig, *, nproc: int, timeout_s: float | None = None) -> int:
    """Run ``cfg`` on ``nproc`` processes; returns the exit status (0 on success)."""
    if under_torchrun():
        from meshplan.runtime.worker import worker_main

        return worker_main([cfg])
    validate(cfg, nproc)
    with tempfile.TemporaryDirectory(prefix="meshplan-run-") as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(cfg.to_json())
        try:
            return subprocess.run(torchrun_command(str(path), nproc), timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            print(f"error: run exceeded {timeout_s} s and was stopped", file=sys.stderr)
            return 124
