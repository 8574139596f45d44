"""``meshplan run``: train a plan for real on torch.distributed (torchrun, gloo on CPU, NCCL on GPU).

torch is imported only inside the command, so ``meshplan --help`` and planning never need it. Before any process
starts, the flags, the plan, the model and the host are checked (``runtime.launch.validate``,
``runtime.host.preflight``); the workers then run as a supervised tree that a stop signal or the wall timeout
removes whole (``runtime.procs``).
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer

from meshplan.errors import SpecError


def _profile_steps(text: str, steps: int) -> tuple[int, ...]:
    try:
        out = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise SpecError("--profile", text, "expected comma-separated step numbers, e.g. 3,4") from None
    bad = [s for s in out if not 1 <= s <= steps]
    if bad:
        raise SpecError("--profile", text, f"steps are 1..{steps} (--steps {steps}); {bad[0]} is not one")
    return out


def positive(flag: str, value: float | None, *, zero_ok: bool = False, what: str = "") -> None:
    """Raise SpecError unless ``value`` (when given) is a finite number > 0 (>= 0 with ``zero_ok``)."""
    if value is None:
        return
    ok = math.isfinite(value) and (value >= 0 if zero_ok else value > 0)
    if not ok:
        raise SpecError(flag, value, f"must be a finite number {'>= 0' if zero_ok else '> 0'}" +
                        (f" ({what})" if what else ""))


def writable_folder(flag: str, path: str) -> None:
    """Raise SpecError unless ``path`` is, or can be created as, a folder this user can write into."""
    if not path:
        return
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise SpecError(flag, path, "is a file; give a folder")
    probe = p
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise SpecError(flag, path, f"cannot be written: {probe} is not a writable folder")


def parse_switches(texts: list[str], *, model_ref: str, check: bool, dry_run: bool) -> tuple[dict, ...]:
    """``--switch B.toml@STEP`` values as RunConfig switches; the plan file must be of the same model."""
    from meshplan.spec.plan_file import read_plan_file

    out = []
    for text in texts:
        path, sep, step = text.rpartition("@")
        if not sep or not path or not step.isdigit():
            raise SpecError("--switch", text, "expected PLAN.toml@STEP, e.g. b.toml@50 (switch after step 50)")
        if not Path(path).is_file():
            raise SpecError("--switch", text, f"{path} is not a plan file")
        plan, refs = read_plan_file(path)
        if refs.get("model") and refs["model"] != model_ref:
            raise SpecError("--switch", text, f"{path} is a plan of {refs['model']}, the run trains {model_ref}")
        out.append({"step": int(step), "plan": plan.to_dict(), "check": check, "dry_run": dry_run})
    return tuple(out)


def run_pools(gpus_ref: str | None, plans: list) -> tuple[int, ...]:
    """GPUs per pool of the cluster the plan file names (``gpus``), when it has several pools: uneven batch shares
    are per pool. A plan with shares needs them."""
    from meshplan import catalog

    pools = tuple(p.n_gpus for p in catalog.cluster(gpus_ref).pools) if gpus_ref else ()
    shares = next((p.batch_shares for p in plans if p.batch_shares), ())
    if shares and not pools:
        raise SpecError("plan.batch_shares", list(shares), "are micro-batches per GPU pool: the plan file needs "
                        "gpus = \"...\" naming its pools, as meshplan plan --out writes it")
    return pools if len(pools) > 1 else ()


@contextlib.contextmanager
def stops_cleanly():
    """Within the block a stop signal (Ctrl-C, SIGTERM, SIGHUP) ends the command with one line on stderr and the
    shell's 128 + signal status, after the supervised processes are gone."""
    from meshplan.runtime.procs import Interrupted, stop_signals_raise

    try:
        with stop_signals_raise():
            yield
    except Interrupted as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(exc.exit_code) from None


def _check_flags(*, steps: int, nproc: int | None, lr: float, timeout: float, wall_timeout: float | None,
                 checkpoint: tuple[str, int, bool], out: str, seed: int) -> None:
    directory, every, resume = checkpoint
    if steps < 1:
        raise SpecError("--steps", steps, "must be >= 1")
    if nproc is not None and nproc < 1:
        raise SpecError("--nproc", nproc, "must be >= 1 (or left out: the plan's tp*cp*pp*dp)")
    if seed < 0:
        raise SpecError("--seed", seed, "must be >= 0")
    positive("--lr", lr, what="AdamW's learning rate")
    positive("--timeout", timeout, what="seconds a collective may wait for a peer")
    positive("--wall-timeout", wall_timeout, what="seconds the whole run may take")
    if every < 0:
        raise SpecError("--checkpoint-every", every, "must be >= 0 (0 = only at the end)")
    if (every or resume) and not directory:
        raise SpecError("--checkpoint-every" if every else "--resume", every or resume, "needs --checkpoint-dir")
    writable_folder("--checkpoint-dir", directory)
    writable_folder("--out", out)


@dataclass(frozen=True, kw_only=True)
class RunArgs:
    """The options of ``meshplan run`` as given (``run_cmd``'s parameters, which document each)."""

    plan: str
    model: Optional[str]
    steps: int
    nproc: Optional[int]
    data: str
    seed: int
    lr: float
    checkpoint_dir: str
    checkpoint_every: int
    resume: bool
    profile: str
    out: str
    timeout: float
    wall_timeout: Optional[float]
    switch: list[str]
    switch_check: bool
    switch_dry_run: bool
    elastic: int


def register(app: typer.Typer) -> None:
    """Add the ``run`` command."""
    app.command("run")(run_cmd)


def run_cmd(
    plan: str = typer.Option(..., "--plan", help="Plan file (TOML/JSON) with a [plan] table."),
    model: Optional[str] = typer.Option(None, "--model", help="Catalog model or config.json; default: the "
                                        "plan file's model."),
    steps: int = typer.Option(10, "--steps", help="Optimizer steps (>= 1)."),
    nproc: Optional[int] = typer.Option(None, "--nproc", help="Processes to launch; default: the plan's "
                                        "tp*cp*pp*dp. Ignored under torchrun."),
    data: str = typer.Option("synthetic", "--data", help="synthetic, corpus, or a UTF-8 text file."),
    seed: int = typer.Option(0, "--seed", help="Seed of weights and data (>= 0)."),
    lr: float = typer.Option(3e-3, "--lr", help="AdamW learning rate (> 0)."),
    checkpoint_dir: str = typer.Option("", "--checkpoint-dir", help="Folder of DCP checkpoints."),
    checkpoint_every: int = typer.Option(0, "--checkpoint-every", help="Save every K steps (0 = at the end "
                                         "only)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest complete checkpoint."),
    profile: str = typer.Option("", "--profile", help="Steps to trace with the PyTorch profiler, e.g. 3,4."),
    out: str = typer.Option("", "--out", help="Folder for metrics.jsonl and profiler traces."),
    timeout: float = typer.Option(60.0, "--timeout", help="Process-group timeout (s, > 0)."),
    wall_timeout: Optional[float] = typer.Option(None, "--wall-timeout", help="Stop the whole run, model "
                                                 "build included, after this many seconds."),
    switch: list[str] = typer.Option([], "--switch", help="Switch live to another plan after a step: "
                                     "PLAN.toml@STEP (repeatable); parameters and optimizer state move between "
                                     "ranks, no checkpoint."),
    switch_check: bool = typer.Option(False, "--switch-check", help="Also load each switch's layout from a "
                                      "DCP checkpoint and report whether both are bit-equal."),
    switch_dry_run: bool = typer.Option(False, "--switch-dry-run", help="Plan and price each switch without "
                                        "moving anything (training stays on the first plan)."),
    elastic: int = typer.Option(0, "--elastic", min=0, help="When ranks are killed, re-plan for the survivors "
                                "and resume from the last checkpoint, up to this many times (needs "
                                "--checkpoint-dir)."),
) -> None:
    """Train the plan on torchrun workers; one JSON line of metrics per step, then a summary.

    A plan this host cannot hold (CPU ranks beyond 4 per core and 8 in all, more ranks than visible GPUs, or
    more memory than it has available) is refused before any process starts."""
    args = RunArgs(**locals())  # exactly the parameters above
    cfg, refs, world = _config(args)
    _start(cfg, refs=refs, world=world, elastic=args.elastic, wall_timeout=args.wall_timeout)


def _config(a: RunArgs):
    """The run's RunConfig, its plan file's references and its world size, every flag, the plan and the model
    checked before torch is imported."""
    from meshplan.cli.common import resolve_model
    from meshplan.spec.plan_file import plan_from_dict, read_plan_file

    _check_flags(steps=a.steps, nproc=a.nproc, lr=a.lr, timeout=a.timeout, wall_timeout=a.wall_timeout,
                 checkpoint=(a.checkpoint_dir, a.checkpoint_every, a.resume), out=a.out, seed=a.seed)
    if a.elastic and not a.checkpoint_dir:
        raise SpecError("--elastic", a.elastic, "needs --checkpoint-dir (a restart resumes from its last checkpoint)")
    profile_steps = _profile_steps(a.profile, a.steps)
    if profile_steps and not a.out:
        raise SpecError("--profile", a.profile, "needs --out FOLDER for the traces")
    the_plan, refs = read_plan_file(a.plan)
    model_ref = a.model or refs.get("model")
    if not model_ref:
        raise SpecError("--model", None, f"{a.plan} names no model; give --model NAME or a config.json")
    resolve_model(model_ref)  # a bad model reference fails here, before torch is imported
    from meshplan.runtime.host import require_torch

    require_torch("meshplan run")

    from meshplan.runtime.config import RunConfig

    switches = parse_switches(a.switch, model_ref=model_ref, check=a.switch_check, dry_run=a.switch_dry_run)
    pools = run_pools(refs.get("gpus"), [the_plan] + [plan_from_dict(s["plan"]) for s in switches])
    cfg = RunConfig(plan=the_plan, model=model_ref, steps=a.steps, seed=a.seed, data=a.data, lr=a.lr, pools=pools,
                    checkpoint_dir=a.checkpoint_dir, checkpoint_every=a.checkpoint_every, resume=a.resume,
                    profile_steps=profile_steps, out_dir=a.out, timeout_s=a.timeout, switches=switches)
    return cfg, refs, a.nproc or the_plan.n_gpus


def _start(cfg, *, refs: dict, world: int, elastic: int, wall_timeout: Optional[float]) -> None:
    """Run ``cfg`` on ``world`` workers (as this torchrun worker, or as their supervised launcher), restarting on
    the survivors up to ``elastic`` times."""
    from meshplan.runtime.config import RUNTIME_STACK
    from meshplan.runtime.launch import launch, prepare, progress, start, under_torchrun

    if under_torchrun():
        raise typer.Exit(launch(cfg, nproc=world))
    with stops_cleanly():
        summary = prepare(cfg, nproc=world, gpus_ref=refs.get("gpus"))
        if cfg.plan.framework != RUNTIME_STACK:
            progress(f"note: the plan was predicted for {cfg.plan.framework}; meshplan's runtime runs it as "
                     f"the {RUNTIME_STACK} stack (predict that with --framework {RUNTIME_STACK})")
        if elastic:
            from meshplan.runtime.launch import start_elastic

            rc = start_elastic(cfg, nproc=world, summary=summary, restarts=elastic, timeout_s=wall_timeout)
        else:
            rc = start(cfg, nproc=world, summary=summary, timeout_s=wall_timeout)
    if rc:
        raise typer.Exit(rc)
