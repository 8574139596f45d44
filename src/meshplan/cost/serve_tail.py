"""Percentiles of a serving prediction, for SLOs that bind a percentile (p50, p90, p99) rather than the mean.

With fixed lengths the spread comes from two places. Waiting: a share ``wait_prob`` of requests find the queue
busy and, in heavy traffic, wait an exponentially distributed time (Kingman 1962: the G/G/1 wait is approximately
exponential; M/D/1 P(W > 0) = rho), so the q-quantile is W/p ln(p / (1 - q)) when 1 - q < p, else 0, on top of
the wait every request pays. Streaming gaps: most decode steps take ``decode_step``; a share ``stall_share``
also carry a prefill (or chunk) and take ``stall`` longer. A request's TPOT averages its own O gaps: in a closed
loop with fixed lengths its percentiles stay at the mean; under Poisson arrivals the gaps vary with the prompts
each step takes in (``ServePrediction.tpot_spread``), and the TPOT quantile is that of a mixture of normals, one
per output length (central limit over a request's gaps).
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


def tpot_quantile(pred: ServePrediction, q: float) -> float:
    """The q-quantile of per-request TPOT: the mean when no spread is known, else the point of the mixture of
    normals N(tpot, sd_i) (weights p_i) that leaves 1 - q above it, by bisection."""
    spread = [(sd, p) for sd, p in pred.tpot_spread if sd > 0 and p > 0]
    if not spread:
        return pred.tpot
    total = sum(p for _, p in spread)

    def above(x: float) -> float:
        return sum(p * 0.5 * math.erfc((x - pred.tpot) / (sd * math.sqrt(2))) for sd, p in spread) / total

    lo, hi = pred.tpot - 10 * max(sd for sd, _ in spread), pred.tpot + 10 * max(sd for sd, _ in spread)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if above(mid) > 1 - q else (lo, mid)
    return max((lo + hi) / 2, 0.0)


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
        return tpot_quantile(pred, q)
    if metric == "e2e":
        return pred.e2e - pred.ttft + ttft
    # ITL: the gap is a plain step unless more than 1 - q of the steps carry a prefill.
    base = pred.tpot - pred.stall_share * pred.stall
    gap = base + pred.stall if pred.stall_share > 1 - q else base
    return pred.itl / max(pred.tpot, 1e-12) * gap
