"""Launch runtime configurations under torchrun (gloo, CPU) with a timeout, and read their metrics back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from meshplan.runtime.config import RunConfig  # noqa: E402
from meshplan.runtime.launch import torchrun_command, worker_env  # noqa: E402
from meshplan.runtime.procs import run_tree  # noqa: E402
from meshplan.spec.plan import Plan  # noqa: E402

TOL = 1e-5
"""Largest |loss - reference| accepted in fp32."""


def config(tmp: Path, name: str, *, model: str = "tiny-llama", steps: int = 3, **plan) -> RunConfig:
    """A small fp32 run writing its metrics under tmp/name."""
    fields = {"global_batch": 4, "seq_len": 32, "precision": "fp32", **plan}
    extra = {k: fields.pop(k) for k in ("checkpoint_dir", "checkpoint_every", "resume", "fail_at_step", "data")
             if k in fields}
    return RunConfig(plan=Plan(**fields), model=model, steps=steps, out_dir=str(tmp / name), timeout_s=30, **extra)


def launch(cfgs: list[RunConfig], *, nproc: int, tmp: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run every config in one torchrun launch of ``nproc`` processes, supervised like ``meshplan run``'s (a
    timeout leaves no worker behind); returncode -1 when it timed out."""
    path = tmp / f"configs-{len(list(tmp.glob('configs-*')))}.json"
    path.write_text(json.dumps([json.loads(c.to_json()) for c in cfgs]))
    cmd = torchrun_command(str(path), nproc)
    done = run_tree(cmd, timeout_s=timeout, capture=True, env=worker_env(nproc))
    note = f"\n(stopped after {timeout} s)" if done.timed_out else ""
    return subprocess.CompletedProcess(cmd, -1 if done.timed_out else done.returncode, done.stdout or "",
                                       (done.stderr or "") + note)


def _rows(cfg: RunConfig) -> list[dict]:
    rows = [json.loads(line) for line in (Path(cfg.out_dir) / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if not r.get("summary")]


def losses(cfg: RunConfig) -> list[float]:
    """Per-step losses a run wrote (the summary line excluded)."""
    return [r["loss"] for r in _rows(cfg)]


def grad_norms(cfg: RunConfig) -> list[float]:
    """Per-step gradient norms (before clipping) a run wrote."""
    return [r["grad_norm"] for r in _rows(cfg)]


def check_ok(proc: subprocess.CompletedProcess) -> None:
    """Fail with the tail of the workers' output when the launch failed."""
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def python() -> str:
    """The interpreter running the tests."""
    return sys.executable
