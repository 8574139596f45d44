"""``meshplan explain PLAN``: the report as terminal text (layout, figures, where the time goes, what limits the
plan, memory per stage, the simulated step, and why each alternative loses)."""

from __future__ import annotations

from typing import Optional

import typer

MIN_WIDTH, MAX_WIDTH = 40, 1000
"""Text widths the report can lay out (its tables need about 40 columns)."""


def register(app: typer.Typer) -> None:
    """Add the ``explain`` command."""

    @app.command("explain")
    def explain(
        plan_file: str = typer.Argument(..., help="Plan file (TOML, as written by meshplan plan)."),
        model: str = typer.Option("", "--model", help="Model (catalog name or file); overrides the plan file's."),
        gpus: str = typer.Option("", "--gpus", help="GPUs, e.g. 256xh100-sxm; overrides the plan file's."),
        cluster: str = typer.Option("", "--cluster", help="Cluster TOML file."),
        variants: bool = typer.Option(True, "--variants/--no-variants",
                                      help="Compare with variants of the plan (recompute, micro-batch, ZeRO, "
                                           "schedule)."),
        max_memory_fraction: Optional[float] = typer.Option(
            None, "--max-memory-fraction", help="Judge fit against a memory limit (share of device memory)."),
        width: int = typer.Option(0, "--width", help="Text width in columns (0 = the terminal's, 80 "
                                  "when not a terminal)."),
        framework: str = typer.Option("", "--framework", help="Software stack (default: the plan file's)."),
    ) -> None:
        """Explain a plan in plain text: where the time goes, what limits it, how its variants compare."""
        from meshplan.cli.common import term_width
        from meshplan.cli.report import load_report
        from meshplan.errors import SpecError
        from meshplan.report import render_text

        if width != 0 and not MIN_WIDTH <= width <= MAX_WIDTH:
            raise SpecError("--width", width, f"must be 0 (the terminal's) or {MIN_WIDTH} to {MAX_WIDTH} columns")
        rep = load_report(plan_file, model_ref=model, gpus=gpus, cluster_file=cluster, variants=variants,
                          max_memory_fraction=max_memory_fraction, framework=framework)
        typer.echo(render_text(rep, width=width or term_width()), nl=False)
