"""The serving model against the visible serving measurements: the figures the README quotes, as bounds with room
for the model to move (they are a regression gate, not a fit), no row called out of memory that ran, and the
shipped constants are those the fit script writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshplan.calibrate.serve_validate import validate_serving_csv

CSV = Path(__file__).resolve().parents[3] / "shared" / "validation" / "inference_visible.csv"


@pytest.fixture(scope="module")
def report():
    if not CSV.is_file():
        pytest.skip(f"serving measurements not found at {CSV}")
    return validate_serving_csv(CSV)


def test_no_row_that_ran_is_called_out_of_memory(report):
    assert report.false_oom == ()


def test_decode_and_throughput_errors(report):
    s = report.summary()
    # Measured at the shipped constants: ITL MAPE 5.0 % (median 4.4 %), throughput 5.6 %, TPOT 7.3 % (README,
    # stop 31; stop 29: 5.2 %, 6.7 %, 10.7 %). Bounds at issue #14's 10 %, TPOT's with room for its 8 rows.
    assert s["itl_ms"]["mape_pct"] < 10 and s["itl_ms"]["median_ape_pct"] < 8
    assert s["output_tokens_per_s"]["mape_pct"] < 10
    assert s["tpot_ms"]["mape_pct"] < 12
    assert len(report.rows) >= 450


def test_queue_dominated_ttft_within_twice(report):
    """Where TTFT is mostly waiting for the cache, the wait is within 2x on all but a few rows (measured: 17 of 19;
    the two outside are NIM 70B TP2 at the cache's edge, 0.47-0.50x)."""
    q = [r for r in report.rows if r.metric == "ttft_ms" and r.queue_dominated]
    inside = [r for r in q if 0.5 <= r.predicted / r.measured <= 2]
    assert len(q) >= 15 and len(inside) >= len(q) - 3


def test_single_client_ttft(report):
    """TTFT outside queueing (one client): prefill plus a decode step, within 25 % on average (measured 12.0 %)."""
    ape = [abs(r.error_pct) for r in report.rows if r.metric == "ttft_ms" and r.id.endswith("-c1-ttft")]
    assert len(ape) >= 15 and sum(ape) / len(ape) < 25
