"""Launch runtime configurations under torchrun (gloo, CPU) with a timeout, and read their metrics back."""

from __future__ import annotations

import json
import re
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

PG_TIMEOUT_S = 120
"""Process-group timeout of the test runs: four ranks share two loaded CI cores, where one rank can stall a
collective for tens of seconds (a real hang still ends, at the launch timeout)."""

CRASH = re.compile(r"Signal (6|7|11) \((SIGABRT|SIGBUS|SIGSEGV)\) received")
"""torchrun's report of a rank killed by a native crash (not by its peers' SIGTERM)."""

ROOT_CAUSE = re.compile(r"terminate called|what\(\)|Assertion|enforce fail|Timed out|Error:|Signal \d+ \(")
"""Lines of the workers' output that say why a launch failed."""


def config(tmp: Path, name: str, *, model: str = "tiny-llama", steps: int = 3, **plan) -> RunConfig:
    """A small fp32 run writing its metrics under tmp/name."""
    fields = {"global_batch": 4, "seq_len": 32, "precision": "fp32", **plan}
    extra = {k: fields.pop(k) for k in ("checkpoint_dir", "checkpoint_every", "resume", "fail_at_step", "data")
             if k in fields}
    return RunConfig(plan=Plan(**fields), model=model, steps=steps, out_dir=str(tmp / name),
                     timeout_s=PG_TIMEOUT_S, **extra)


def launch(cfgs: list[RunConfig], *, nproc: int, tmp: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run every config in one torchrun launch of ``nproc`` processes, supervised like ``meshplan run``'s (a
    timeout leaves no worker behind); returncode -1 when it timed out."""
    path = tmp / f"configs-{len(list(tmp.glob('configs-*')))}.json"
    path.write_text(json.dumps([json.loads(c.to_json()) for c in cfgs]))
    cmd = torchrun_command(str(path), nproc)
    done = run_tree(cmd, timeout_s=timeout, capture=True, env=worker_env(nproc))
    fresh = not any(c.resume or c.checkpoint_dir for c in cfgs)  # a rerun must start from the same state
    if fresh and done.returncode and not done.timed_out and CRASH.search(done.stderr or ""):
        # A gloo rank aborting natively (seen once in CI under load, never reproduced) is the transport's, not the
        # layout's: rerun once and say so; a second crash, or any wrong loss, still fails the test.
        print(f"warning: a rank crashed natively, rerunning once:\n{root_cause(done.stderr or '')}", file=sys.stderr)
        for c in cfgs:
            (Path(c.out_dir) / "metrics.jsonl").unlink(missing_ok=True)
        done = run_tree(cmd, timeout_s=timeout, capture=True, env=worker_env(nproc))
    note = f"\n(stopped after {timeout} s)" if done.timed_out else ""
    return subprocess.CompletedProcess(cmd, -1 if done.timed_out else done.returncode, done.stdout or "",
                                       (done.stderr or "") + note)


def meshplan_cli(*args: str, timeout: float = 180, cwd: Path | str | None = None) -> subprocess.CompletedProcess:
    """``python -m meshplan.cli ARGS`` as a user runs it, captured; a launch whose gloo rank aborted natively is
    rerun once, as ``launch`` does (CI saw ``meshplan run`` abort so, "terminate called without an active
    exception", on a test that passes alone). For commands that start fresh: a rerun must see the same state."""
    cmd = [python(), "-m", "meshplan.cli", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    if proc.returncode and CRASH.search(proc.stderr or ""):
        print(f"warning: a rank crashed natively, rerunning once:\n{root_cause(proc.stderr or '')}", file=sys.stderr)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    return proc


def root_cause(text: str, limit: int = 40) -> str:
    """The first lines of the workers' output that say why they failed (the full log is long tracebacks)."""
    return "\n".join([line for line in text.splitlines() if ROOT_CAUSE.search(line)][:limit])


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
    assert proc.returncode == 0, (f"root cause:\n{root_cause(proc.stderr)}\n--- tail:\n"
                                  + proc.stdout[-2000:] + proc.stderr[-3000:])


def python() -> str:
    """The interpreter running the tests."""
    return sys.executable
