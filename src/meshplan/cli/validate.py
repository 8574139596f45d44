"""``meshplan validate FILE.csv``: predict published runs and report the error."""

from __future__ import annotations

import typer

from meshplan.cli.common import print_json

SKIPS_LISTED = 12
"""Skipped rows listed one by one; more are counted by reason (``--json`` lists every one)."""


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
    if len(report.skipped) <= SKIPS_LISTED:
        for i, why in report.skipped:
            con.print(f"skipped {i}: {why}")
    else:  # a file of many kinds of rows (the long-sequence/offload/multimodal set): why, counted; --json lists them
        from meshplan.calibrate.validate import skip_kinds

        for why, n in skip_kinds(report.skipped).items():
            con.print(f"skipped {n:3d}: {why}")
    for r in report.rows:  # a stack without a profile is predicted as another's: said, not hidden
        if "no profile" in r.framework:
            con.print(f"note {r.id}: {r.framework}")
    con.print(f"n={len(report.rows)}  MAPE {report.mape:.1f} %  median {report.median_ape:.1f} %  "
              f"max {report.max_ape:.1f} %  skipped {len(report.skipped)}")
    if report.pairs:
        con.print(_pairs_table(report))
    return buf.getvalue()


def _pairs_table(report):
    """Runs of one job differing in one or two knobs: the predicted ratio's error and whether the order is right."""
    from rich.table import Table

    from meshplan.calibrate.pairs import summary

    t = Table(show_header=True, title="pairs: runs of one job that differ in one or two knobs")
    for col in ("knobs", "pairs", "median ratio error %", "max %", "order right"):
        t.add_column(col, justify="left" if col == "knobs" else "right")
    s = summary(list(report.pairs))
    for name, v in [*s["by_knobs"].items(), ("all", s["all"])]:
        t.add_row(name, str(v["n"]), f"{v['median_ratio_error_pct']:.1f}", f"{v['max_ratio_error_pct']:.1f}",
                  f"{v['order_right']}/{v['ordered']}" + (" (ties excluded)" if name == "all" else ""))
    return t


def register(app: typer.Typer) -> None:
    """Add the ``validate`` command."""

    @app.command()
    def validate(
        csv_file: str = typer.Argument(..., help="Training runs CSV (schema of shared/validation/runs_visible.csv), "
                                       "the long-sequence/offload/multimodal set (longseq_offload_mm.csv: its "
                                       "long-sequence training rows) or serving measurements (inference_visible.csv)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
        simulate: bool = typer.Option(False, "--simulate", help="Pipelines by the event simulator."),
    ) -> None:
        """Predict every row of a published-runs, long-sequence or serving CSV and report signed errors, MAPE, median
        and max (rows a model cannot describe are skipped with the reason)."""
        from meshplan.calibrate.csvfile import csv_path
        from meshplan.calibrate.validate import validate_csv

        csv_path(csv_file)  # empty, a folder, missing: said before the header is sniffed
        if _is_serving(csv_file):
            _validate_serving(csv_file, as_json)
            return
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


def _is_serving(path: str) -> bool:
    """The file is a serving-measurements CSV (it names the serving columns in its header)."""
    from pathlib import Path

    from meshplan.calibrate.csvfile import csv_header
    from meshplan.calibrate.serve_validate import is_serving_csv

    return Path(path).is_file() and is_serving_csv(csv_header(path))


def _validate_serving(path: str, as_json: bool) -> None:
    """Per metric: n, MAPE, median and max error; the rows called out of memory although they ran."""
    from io import StringIO

    from rich.console import Console
    from rich.table import Table

    from meshplan.calibrate.serve_validate import validate_serving_csv
    from meshplan.cli.common import term_width

    report = validate_serving_csv(path)
    if as_json:
        print_json(report.as_dict())
        return
    buf = StringIO()
    con = Console(file=buf, width=term_width(), force_terminal=False, no_color=True, highlight=False)
    for title, by in (("serving measurements: predicted vs measured", ()), ("by engine", ("engine",)),
                      ("by GPU", ("gpu",))):
        t = Table(title=title, show_header=True)
        for col in ("metric", "n", "MAPE %", "median %", "max %"):
            t.add_column(col, justify="left" if col == "metric" else "right")
        for key, s in report.summary(by).items():
            t.add_row(key, str(s["n"]), f"{s['mape_pct']:.1f}", f"{s['median_ape_pct']:.1f}",
                      f"{s['max_ape_pct']:.1f}")
        con.print(t)
    con.print(f"predicted {len(report.rows)} rows; skipped {len(report.skipped)} (variable lengths, open-loop rates "
              f"or GPUs not in the catalog; --json lists why); called out of memory although they ran: "
              f"{len(report.false_oom)}")
    typer.echo(buf.getvalue())
