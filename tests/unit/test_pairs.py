"""``meshplan validate``'s pairs: runs of one job (model, GPU type, stack) differing in one or two knobs, the error
of the predicted ratio and whether the order is right."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshplan.calibrate.pairs import KNOBS, Pair, _job, _knobs, summary
from meshplan.calibrate.runs import load_runs
from meshplan.calibrate.validate import validate_csv
from meshplan.cli import main

RUNS = Path(__file__).resolve().parents[3] / "shared" / "validation" / "runs_visible.csv"


def test_ratio_error_and_order_by_hand():
    p = Pair(a="x", b="y", knobs=("recompute",), measured_ratio=1.2, predicted_ratio=1.26)
    assert p.ratio_error_pct == pytest.approx(5.0) and p.order_right and not p.tie
    wrong = Pair(a="x", b="y", knobs=("cp",), measured_ratio=1.1, predicted_ratio=0.95)
    tie = Pair(a="x", b="y", knobs=("cp",), measured_ratio=1.005, predicted_ratio=0.9)
    assert not wrong.order_right and tie.tie and tie.order_right
    s = summary([p, wrong, tie])
    # |errors| 5.0, 13.6 and 10.4 %: median 10.4, max 13.6; the tie is not ordered.
    assert s["all"] == {"n": 3, "median_ratio_error_pct": pytest.approx(100 * (1 - 0.9 / 1.005)),
                        "max_ratio_error_pct": pytest.approx(100 * (1 - 0.95 / 1.1)), "ordered": 2,
                        "order_right": 1}
    assert set(s["by_knobs"]) == {"recompute", "cp"}


@pytest.mark.skipif(not RUNS.is_file(), reason="needs ../shared/validation")
def test_every_pair_is_one_job_differing_in_one_or_two_knobs():
    report = validate_csv(RUNS)
    runs = {r.id: r for r in load_runs(RUNS)[0]}
    pred = {r.id: r.predicted_s for r in report.rows}
    assert len(report.pairs) >= 50
    for p in report.pairs:
        a, b = runs[p.a], runs[p.b]
        assert _job(a) == _job(b)
        assert p.knobs == tuple(k for k in KNOBS if _knobs(a)[k] != _knobs(b)[k]) and 1 <= len(p.knobs) <= 2
        assert p.measured_ratio == pytest.approx(a.measured_s / b.measured_s)
        assert p.predicted_ratio == pytest.approx(pred[p.a] / pred[p.b])


@pytest.mark.skipif(not RUNS.is_file(), reason="needs ../shared/validation")
def test_validate_json_carries_the_pairs(capsys):
    assert main(["validate", str(RUNS), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["pairs_summary"]["all"]["n"] == len(doc["pairs"]) > 0
    assert all(set(p) >= {"a", "b", "knobs", "ratio_error_pct", "order_right"} for p in doc["pairs"])
