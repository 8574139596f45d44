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
    # Measured at the shipped constants: ITL MAPE 4.9 % (median 4.1 %), throughput 5.8 %, TPOT 11.3 % (README,
    # stop 37: the 12 MLPerf rows in, two of them TPOT at 24.8 %; stop 31 without them: 5.0 %, 5.6 %, 7.3 %).
    # Bounds at issue #14's 10 %, TPOT's with room for its 10 rows.
    assert s["itl_ms"]["mape_pct"] < 10 and s["itl_ms"]["median_ape_pct"] < 8
    assert s["output_tokens_per_s"]["mape_pct"] < 10
    assert s["tpot_ms"]["mape_pct"] < 12
    assert len(report.rows) >= 450


def test_queue_dominated_ttft_within_twice(report):
    """Where TTFT is mostly waiting for the cache, the wait is within 2x (issue #14; measured: all 19, since the
    closed loops replay the benchmark run, MAPE 14.4 %; 17 of 19 with the analytic steady state alone)."""
    q = [r for r in report.rows if r.metric == "ttft_ms" and r.queue_dominated]
    inside = [r for r in q if 0.5 <= r.predicted / r.measured <= 2]
    assert len(q) >= 15 and len(inside) == len(q)


def test_ttft_under_concurrency(report):
    """TTFT that is not mostly waiting for the cache, concurrency and open loops included: median error 33 % (the
    analytic steady state alone, whose arrivals are spread in time: 61 %). Issue #14's 20 % MAPE is not met; the
    bound is a regression gate."""
    ape = sorted(abs(r.error_pct) for r in report.rows if r.metric == "ttft_ms" and not r.queue_dominated)
    assert len(ape) >= 90 and ape[len(ape) // 2] < 45


def test_single_client_ttft(report):
    """TTFT outside queueing (one client): prefill plus a decode step, within 25 % on average (measured 12.0 %)."""
    ape = [abs(r.error_pct) for r in report.rows if r.metric == "ttft_ms" and r.id.endswith("-c1-ttft")]
    assert len(ape) >= 15 and sum(ape) / len(ape) < 25


def test_median_e2e_over_variable_replies(report):
    """Median E2E of the ShareGPT rows (SGLang's v0.3.0-vs-vLLM-0.6.0 tables): with every reply at the mean length
    the model read the mean request (MAPE 61.7 %, all +48..+78 %); the replies' log-normal through the published
    mean and median (``catalog/datasets/sharegpt.toml``) gives 9.0 % at the refitted constants, none beyond 21 %."""
    ape = [abs(r.error_pct) for r in report.rows if r.metric == "e2e_latency_s"]
    assert len(ape) >= 8 and sum(ape) / len(ape) < 15 and max(ape) < 30
