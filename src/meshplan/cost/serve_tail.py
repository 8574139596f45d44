"""Percentiles of a serving prediction, for SLOs that bind a percentile (p50, p90, p99) rather than the mean.

With fixed lengths the spread comes from two places. Waiting: a share ``wait_prob`` of requests find the queue
busy and, in heavy traffic, wait an exponentially distributed time (Kingman 1962: the G/G/1 wait is approximately
exponential; M/D/1 P(W > 0) = rho), so the q-quantile is W/p ln(p / (1 - q)) when 1 - q < p, else 0, on top of
the wait every request pays. Streaming gaps: most decode steps take ``decode_step``; a share ``stall_share``
also carry a prefill (or chunk) and take ``stall`` longer. A request's TPOT averages its own O gaps, so with
fixed lengths its percentiles stay at the mean.
"""

from __future__ import annotations

import math

from meshplan.cost.serve_load import ServePrediction
from meshplan.errors import SpecError

METRICS = ("ttft", "tpot", "itl", "e2e")


def wait_quantile(pred: ServePrediction, q: float) -> float:
    """The q-quantile of the wait before the prefill."""
    spread = max(pred.queue_wait - pred.wait_fixed, 0.0)
    p = pred.wait_prob
    if spread <= 0 or p <= 0 or 1 - q >= p:
        return pred.wait_fixed
    return pred.wait_fixed + spread / p * math.log(p / (1 - q))


def quantile(pred: ServePrediction, metric: str, q: float) -> float:
    """The q-quantile (0 < q < 1; 0.5 = median) of ``ttft``, ``tpot``, ``itl`` or ``e2e`` (s)."""
    if metric not in METRICS:
        raise SpecError("metric", metric, f"must be one of {', '.join(METRICS)}")
    if not 0 < q < 1:
        raise SpecError("percentile", q, "must be between 0 and 1 (exclusive)")
    ttft = pred.ttft - pred.queue_wait + wait_quantile(pred, q)
    if metric == "ttft":
        return ttft
    if metric == "tpot":
        return pred.tpot
    if metric == "e2e":
        return pred.e2e - pred.ttft + ttft
    # ITL: the gap is a plain step unless more than 1 - q of the steps carry a prefill.
    base = pred.tpot - pred.stall_share * pred.stall
    gap = base + pred.stall if pred.stall_share > 1 - q else base
    return pred.itl / max(pred.tpot, 1e-12) * gap
