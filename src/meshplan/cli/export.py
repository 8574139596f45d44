"""``meshplan export PLAN --to NAME``: write a plan in a training framework's own configuration format.

Exit status: 0 exact export; 3 when the framework cannot express part of the plan (the parts are printed on
stderr and written as comments into the output) unless ``--allow-approximate``; 2 for user errors.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

APPROXIMATE_EXIT = 3


def run_export(plan_file: str, *, to: str, out: str | None = None, model_ref: str = "", gpus: str = "", fmt: str = "",
               framework: str = "", allow_approximate: bool = False) -> int:
    """Export a plan file; returns the exit status."""
    from meshplan.cli.common import output_path, resolve_framework, resolve_model, wrote
    from meshplan.export.base import get_exporter, render_export, resolve_format
    from meshplan.spec.plan_file import read_plan_file

    if out is not None:
        output_path("--output", out)
    exporter = get_exporter(to)
    fmt = resolve_format(exporter, fmt)
    plan, refs = read_plan_file(plan_file)
    model = resolve_model(model_ref or None, refs.get("model"))
    if framework:
        plan = plan.with_(framework=framework)
    stack = resolve_framework(plan.framework, file_settings=refs.get("framework") if not framework else None)
    _check(model, plan, gpus or refs.get("gpus", ""))
    _warn_unless_fits(model, plan, stack, gpus or refs.get("gpus", ""))
    result = render_export(exporter, model, plan, stack, gpus=gpus or refs.get("gpus", ""), fmt=fmt)
    if out is not None:
        Path(out).write_text(result.text)
        wrote(out, f"{exporter.name} {fmt or 'configuration'}".strip())
    else:
        sys.stdout.write(result.text)
    for note in result.approximations:
        print(f"approximate ({exporter.name}): {note}", file=sys.stderr)
    if result.approximations and not allow_approximate:
        print(f"{len(result.approximations)} approximation(s); pass --allow-approximate to accept them",
              file=sys.stderr)
        return APPROXIMATE_EXIT
    return 0


def _warn_unless_fits(model, plan, stack, gpus: str) -> None:
    """A plan predicted above its GPUs' memory is still exported (the framework decides), with a note saying so."""
    if not gpus:
        return
    from meshplan import catalog
    from meshplan.sim.predict import predict

    est = predict(model, catalog.cluster(gpus), plan, stack=stack)
    if not est.fits:
        print(f"note: this plan does not fit: its predicted peak is {est.peak_memory / 2**30:,.1f} GiB of "
              f"{est.capacity / 2**30:,.1f} GiB per GPU (meshplan estimate --plan shows where it goes)",
              file=sys.stderr)


def _check(model, plan, gpus: str) -> None:
    """The plan must be valid for its model (and its GPUs when known) before any framework is asked to run it:
    the same checks as ``meshplan estimate``."""
    from meshplan import catalog
    from meshplan.errors import PlanError
    from meshplan.spec.checks import model_violations, plan_violations

    bad = plan_violations(model, catalog.cluster(gpus), plan) if gpus else model_violations(model, plan)
    if bad:
        raise PlanError(bad)


def register(app: typer.Typer) -> None:
    """Add the ``export`` command."""

    @app.command("export")
    def export(
        plan_file: str = typer.Argument(..., help="Plan file (TOML written by meshplan plan)."),
        to: str = typer.Option(..., "--to", help="Framework: megatron, torchtitan or deepspeed."),
        out: Optional[str] = typer.Option(None, "-o", "--output", help="Output file (default: stdout)."),
        model: str = typer.Option("", "--model", help="Model (catalog name or file); overrides the plan file's."),
        gpus: str = typer.Option("", "--gpus", help="GPUs, e.g. 256xh100-sxm; overrides the plan file's."),
        fmt: str = typer.Option("", "--format", help="Output layout; torchtitan: toml (0.1/0.2) or python (>=0.3)."),
        framework: str = typer.Option("", "--framework",
                                      help="The stack the plan was predicted for (default: the plan file's)."),
        allow_approximate: bool = typer.Option(False, "--allow-approximate",
                                               help="Exit 0 even when the framework cannot express the whole plan."),
    ) -> None:
        """Export a plan to Megatron-LM, torchtitan or DeepSpeed configuration."""
        code = run_export(plan_file, to=to, out=out, model_ref=model, gpus=gpus, fmt=fmt, framework=framework,
                          allow_approximate=allow_approximate)
        if code:
            raise typer.Exit(code)
