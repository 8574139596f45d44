"""``meshplan validate FILE.csv``: predict published runs and report the error."""

from __future__ import annotations

import typer

from meshplan.cli.common import print_json


def render(report, width: int = 80) -> str:
    """Per-row table and the summary line in ``width`` columns."""
    from io import StringIO

    from rich.console import Console
    from rich.table import Table

    buf = StringIO()
    con = Console(file=buf, width=width, force_terminal=False, no_color=True, highlight=False)
    t = Table(show_header=True, title="published runs: measured vs predicted step time")
    for col, just in (("id", "left"), ("measured s", "right"), ("predicted s", "right"), ("error %", "right"),
                      ("peak GiB", "right")):
        t.add_column(col, justify=just)
    for r in report.rows:
        t.add_row(r.id, f"{r.measured_s:.3f}", f"{r.predicted_s:.3f}", f"{r.error_pct:+.1f}",
                  f"{r.peak_memory_gib:.1f}")
    con.print(t)
    for i, why in report.skipped:
        con.print(f"skipped {i}: {why}")
    con.print(f"n={len(report.rows)}  MAPE {report.mape:.1f} %  median {report.median_ape:.1f} %  "
              f"max {report.max_ape:.1f} %  skipped {len(report.skipped)}")
    return buf.getvalue()


def register(app: typer.Typer) -> None:
    """Add the ``validate`` command."""

    @app.command()
    def validate(
        csv_file: str = typer.Argument(..., help="Runs CSV in the schema of shared/validation/runs_visible.csv."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
        simulate: bool = typer.Option(False, "--simulate", help="Pipelines by the event simulator."),
    ) -> None:
        """Predict every row of a published-runs CSV and report signed errors, MAPE, median and max."""
        from meshplan.calibrate.validate import validate_csv

        report = validate_csv(csv_file, simulate=simulate)
        if not report.rows:
            from meshplan.errors import SpecError

            first = report.skipped[0][1] if report.skipped else ""
            raise SpecError("file", csv_file, f"no row could be predicted ({len(report.skipped)} skipped; first: "
                            f"{first})")
        if as_json:
            print_json(report.as_dict())
        else:
            from meshplan.cli.common import term_width

            typer.echo(render(report, width=term_width()))
