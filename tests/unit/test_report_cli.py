"""``meshplan report PLAN -o FILE`` on a plan file alone, and its one-line error without plotly."""

from __future__ import annotations

import sys

import pytest
import typer
from test_report import PLAN, small_report
from typer.testing import CliRunner

from meshplan.errors import MeshplanError
from meshplan.spec.plan_file import plan_file_text


def _app() -> typer.Typer:
    from meshplan.cli import report

    app = typer.Typer()
    report.register(app)
    app.command("noop")(lambda: None)   # a second command keeps typer's subcommand parsing
    return app


@pytest.fixture
def plan_file(tmp_path):
    path = tmp_path / "plan.toml"
    path.write_text(plan_file_text(PLAN, model="llama3-8b", gpus="16xh100-sxm"))
    return path


def test_report_command_writes_the_page(plan_file, tmp_path):
    pytest.importorskip("plotly")
    out = tmp_path / "report.html"
    result = CliRunner().invoke(_app(), ["report", str(plan_file), "-o", str(out), "--max-memory-fraction", "0.8"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"wrote {out} (")
    page = out.read_text(encoding="utf-8")
    est = small_report().estimate
    assert f"{est.step_time:.3f} s" in page
    assert f"limit {0.8 * est.capacity / 2**30:.1f} GiB" in page
    assert "Alternatives: variants of this plan" in page


def test_report_command_without_plotly_fails_in_one_line(plan_file, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "plotly", None)
    monkeypatch.setitem(sys.modules, "plotly.graph_objects", None)
    out = tmp_path / "report.html"
    result = CliRunner().invoke(_app(), ["report", str(plan_file), "-o", str(out)])
    assert isinstance(result.exception, MeshplanError)
    assert str(result.exception) == "the HTML report needs plotly: pip install 'meshplan[report]'"
    assert not out.exists()


def test_report_rejects_a_bad_memory_fraction(plan_file, tmp_path):
    result = CliRunner().invoke(_app(), ["report", str(plan_file), "-o", str(tmp_path / "r.html"),
                                         "--max-memory-fraction", "0"])
    assert isinstance(result.exception, MeshplanError)
    assert "--max-memory-fraction" in str(result.exception)
