"""``meshplan report PLAN -o report.html``: one self-contained HTML page of a plan's prediction, simulated step
and alternatives. ``load_report`` is shared with ``meshplan explain``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from meshplan.errors import SpecError


def load_report(plan_file: str, *, model_ref: str = "", gpus: str = "", cluster_file: str = "",
                variants: bool = True, max_memory_fraction: float | None = None, framework: str = ""):
    """Read a plan file, estimate it with the event simulator, simulate its step, and evaluate its variants.

    Args:
        max_memory_fraction: planner's memory limit as a share of device memory (None = no limit drawn).
    """
    from meshplan.cli.common import resolve_cluster, resolve_framework, resolve_model
    from meshplan.cost.estimate import estimate
    from meshplan.report import build_report, evaluate_variants
    from meshplan.sim import simulate
    from meshplan.sim.adapter import simulated_pipeline
    from meshplan.spec.plan_file import read_plan_file

    _check_fraction("--max-memory-fraction", max_memory_fraction)
    plan, refs = read_plan_file(plan_file)
    if max_memory_fraction is None:
        # The limit the plan was searched under (meshplan plan writes it), so variants are judged as the search did.
        max_memory_fraction = file_fraction(plan_file, refs)
    model = resolve_model(model_ref or None, refs.get("model"))
    cluster = resolve_cluster(gpus or None, cluster_file or None, refs.get("gpus") or refs.get("cluster"))
    if framework:
        plan = plan.with_(framework=framework)
    stack = resolve_framework(plan.framework, file_settings=None if framework else refs.get("framework"))
    pipeline = simulated_pipeline()
    est = estimate(model, cluster, plan, stack=stack, pipeline=pipeline)
    timeline = simulate(plan.schedule_name, est.stage_times, pp=plan.pp, vpp=plan.vpp, n_micro=plan.n_micro)
    alts, skipped = evaluate_variants(model, cluster, plan, stack=stack, pipeline=pipeline) if variants else ([], [])
    limit = max_memory_fraction * est.capacity if max_memory_fraction is not None else None
    return build_report(model, cluster, plan, est, timeline, alternatives=alts, memory_limit=limit,
                        skipped=skipped)


def _check_fraction(field: str, value) -> None:
    """A memory limit as a share of device memory: a finite number in (0, 4], or None (no limit)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not 0 < value <= 4):
        raise SpecError(field, value, "must be a number in (0, 4] (a share of device memory, e.g. 0.84)")


def file_fraction(plan_file: str, refs: dict) -> float | None:
    """The plan file's ``[predicted] max_memory_fraction`` (None when it has none), checked like the flag."""
    pred = refs.get("predicted")
    if pred is None:
        return None
    if not isinstance(pred, dict):
        raise SpecError(f"{plan_file}.predicted", pred, "must be a table, e.g. [predicted] with "
                        "max_memory_fraction = 0.84 (meshplan plan --out writes it)")
    value = pred.get("max_memory_fraction")
    _check_fraction(f"{plan_file}.predicted.max_memory_fraction", value)
    return value


def write_report(plan_file: str, *, out: str, **kwargs) -> int:
    """Render the HTML page of a plan file to ``out``; returns its size in bytes."""
    from meshplan.cli.common import output_path
    from meshplan.report.figures import plotly_go
    from meshplan.report.html import render_html

    output_path("--output", out)

    plotly_go()  # fail on a missing extra before any work
    page = render_html(load_report(plan_file, **kwargs))
    Path(out).write_text(page, encoding="utf-8")
    return len(page.encode("utf-8"))


def register(app: typer.Typer) -> None:
    """Add the ``report`` command."""

    @app.command("report")
    def report(
        plan_file: str = typer.Argument(..., help="Plan file (TOML, as written by meshplan plan)."),
        out: str = typer.Option("report.html", "-o", "--output", help="HTML file to write."),
        model: str = typer.Option("", "--model", help="Model (catalog name or file); overrides the plan file's."),
        gpus: str = typer.Option("", "--gpus", help="GPUs, e.g. 256xh100-sxm; overrides the plan file's."),
        cluster: str = typer.Option("", "--cluster", help="Cluster TOML file."),
        variants: bool = typer.Option(True, "--variants/--no-variants",
                                      help="Compare with variants of the plan (recompute, micro-batch, ZeRO, "
                                           "schedule)."),
        max_memory_fraction: Optional[float] = typer.Option(
            None, "--max-memory-fraction", help="Draw and judge against a memory limit (share of device memory)."),
        framework: str = typer.Option("", "--framework", help="Software stack (default: the plan file's)."),
    ) -> None:
        """Write a self-contained HTML report of a plan: figures, Gantt chart, memory, time, alternatives."""
        size = write_report(plan_file, out=out, model_ref=model, gpus=gpus, cluster_file=cluster,
                            variants=variants, max_memory_fraction=max_memory_fraction, framework=framework)
        from meshplan.cli.common import wrote

        wrote(out, f"{size / 2**20:.1f} MiB")
