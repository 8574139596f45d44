"""``meshplan explain``: the report as text, and the character timeline checked against a hand-drawn one."""

from __future__ import annotations

import re

import pytest
import typer
from sim_helpers import uniform
from test_report import PLAN, small_report
from typer.testing import CliRunner

from meshplan.report import render_text
from meshplan.report.analysis import GIB, comparisons
from meshplan.report.layout import layout_text
from meshplan.report.text import ascii_timeline
from meshplan.sim import simulate
from meshplan.spec.plan_file import plan_file_text


def test_ascii_timeline_by_hand():
    # 1F1B, 2 ranks, 2 micro-batches, F = 1 s, B = 2 s, dp tail 0.5 s: step 9.5 s, 0.5 s per column.
    tl = simulate("1f1b", uniform(2, dp_tail=(0.5, 0.5)), pp=2, vpp=1, n_micro=2)
    assert tl.step_time == 9.5
    assert ascii_timeline(tl, width=19) == ["r0   |FFFF....BBBB..BBBBd|",
                                            "r1   |..FFBBBBFFBBBBd....|"]


def test_ascii_timeline_marks_mixed_columns():
    # One column over F 2 s, B 4 s, dp 0.5 s: B holds 62 % of it, under the 75 % needed to name one kind.
    tl = simulate("1f1b", uniform(1, dp_tail=(0.5,)), pp=1, vpp=1, n_micro=2)
    assert ascii_timeline(tl, width=1) == ["r0   |x|"]
    assert ascii_timeline(tl, width=13) == ["r0   |FFBBBBFFBBBBd|"]


@pytest.fixture(scope="module")
def rep():
    return small_report()


def test_text_has_the_figures_and_where_the_time_goes(rep):
    text = render_text(rep, width=160)
    est = rep.estimate
    assert f"step time         │ {est.step_time:.3f} s" in text
    assert layout_text(rep.plan) in text
    compute_row = rf"│ compute +│ +{est.time.compute:.3f} │ +{100 * est.time.compute / est.step_time:.1f} │ #+ +│"
    assert re.search(compute_row, text)
    table = text[text.index("where the time goes"):]
    order = [table.index(f"│ {name} ") for name in ("compute", "pipeline bubble", "TP communication",
                                                     "fixed overhead", "optimizer step", "DP/ZeRO communication")]
    assert order == sorted(order)   # largest first
    assert f"largest exposed overhead: pipeline bubble {est.time.bubble:.3f} s" in text


def test_text_has_memory_per_stage_and_the_timeline(rep):
    text = render_text(rep, width=160)
    for r, mb in enumerate(rep.estimate.memory_per_stage):
        assert f"│ r{r}   │" in text and f"{mb.total() / GIB:.1f}" in text
    rows = [line for line in text.splitlines() if line.startswith("r") and "|" in line]
    assert [row[:4] for row in rows] == ["r0  ", "r1  ", "r2  ", "r3  "]
    assert all(len(row) == len(rows[0]) for row in rows)


def test_text_says_why_each_alternative_loses(rep):
    text = render_text(rep, width=160)
    for c in comparisons(rep):
        assert f"{c.status}: {c.text}" in text, c.label
    full = next(c for c in comparisons(rep) if c.label == "recompute=full")
    assert full.status in ("loses", "trade-off") and full.text.startswith("slower by ")


def test_explain_command_on_a_plan_file(tmp_path):
    from meshplan.cli import explain

    path = tmp_path / "plan.toml"
    path.write_text(plan_file_text(PLAN, model="llama3-8b", gpus="16xh100-sxm"))
    app = typer.Typer()
    explain.register(app)
    app.command("noop")(lambda: None)   # a second command keeps typer's subcommand parsing
    result = CliRunner().invoke(app, ["explain", str(path), "--no-variants", "--width", "120"])
    assert result.exit_code == 0, result.output
    est = small_report(variants=False).estimate
    assert f"{est.step_time:.3f} s" in result.output
    assert "where the time goes" in result.output and "alternatives" not in result.output
