"""``meshplan run``: train a plan for real on torch.distributed (torchrun, gloo on CPU, NCCL on GPU).

torch is imported only inside the command, so ``meshplan --help`` and planning never need it.
"""

from __future__ import annotations

import sys
from typing import Optional

import typer

from meshplan.errors import SpecError


def _profile_steps(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise SpecError("--profile", text, "expected comma-separated step numbers, e.g. 3,4") from None


def register(app: typer.Typer) -> None:
    """Add the ``run`` command."""

    @app.command("run")
    def run_cmd(
        plan: str = typer.Option(..., "--plan", help="Plan file (TOML/JSON) with a [plan] table."),
        model: Optional[str] = typer.Option(None, "--model", help="Catalog model or config.json; default: the "
                                            "plan file's model."),
        steps: int = typer.Option(10, "--steps", help="Optimizer steps."),
        nproc: Optional[int] = typer.Option(None, "--nproc", help="Processes to launch; default: the plan's "
                                            "tp*cp*pp*dp. Ignored under torchrun."),
        data: str = typer.Option("synthetic", "--data", help="synthetic, corpus, or a text file."),
        seed: int = typer.Option(0, "--seed", help="Seed of weights and data."),
        lr: float = typer.Option(3e-3, "--lr", help="AdamW learning rate."),
        checkpoint_dir: str = typer.Option("", "--checkpoint-dir", help="Folder of DCP checkpoints."),
        checkpoint_every: int = typer.Option(0, "--checkpoint-every", help="Save every K steps."),
        resume: bool = typer.Option(False, "--resume", help="Continue from the newest complete checkpoint."),
        profile: str = typer.Option("", "--profile", help="Steps to trace with the PyTorch profiler, e.g. 3,4."),
        out: str = typer.Option("", "--out", help="Folder for metrics.jsonl and profiler traces."),
        timeout: float = typer.Option(60.0, "--timeout", help="Process-group timeout (s)."),
        wall_timeout: Optional[float] = typer.Option(None, "--wall-timeout", help="Stop the whole run after this "
                                                     "many seconds."),
    ) -> None:
        """Train the plan on torchrun workers; one JSON line of metrics per step, then a summary."""
        from meshplan.cli.common import resolve_model
        from meshplan.spec.io import read_plan_file

        the_plan, refs = read_plan_file(plan)
        model_ref = model or refs.get("model")
        resolve_model(model_ref)  # a bad model reference fails here, before torch is imported
        profile_steps = _profile_steps(profile)
        if profile_steps and not out:
            raise SpecError("--profile", profile, "needs --out FOLDER for the traces")

        from meshplan.runtime.config import RUNTIME_STACK, RunConfig
        from meshplan.runtime.launch import launch

        if the_plan.framework != RUNTIME_STACK:
            print(f"note: the plan was predicted for {the_plan.framework}; meshplan's runtime runs it as the "
                  f"{RUNTIME_STACK} stack (predict that with --framework {RUNTIME_STACK})", file=sys.stderr)

        cfg = RunConfig(plan=the_plan, model=model_ref, steps=steps, seed=seed, data=data, lr=lr,
                        checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every, resume=resume,
                        profile_steps=profile_steps, out_dir=out, timeout_s=timeout)
        rc = launch(cfg, nproc=nproc or the_plan.n_gpus, timeout_s=wall_timeout)
        if rc:
            raise typer.Exit(rc)
