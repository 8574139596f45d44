"""Percentiles of a serving prediction, for SLOs that bind a percentile (p50, p90, p99) rather than the mean.

With fixed lengths the spread comes from two places. Waiting: a share ``wait_prob`` of requests find the queue
busy and, in heavy traffic, wait an exponentially distributed time (Kingman 1962: the G/G/1 wait is approximately
exponential; M/D/1 P(W > 0) = rho), so the q-quantile is W/p ln(p / (1 - q)) when 1 - q < p, else 0, on top of
the wait every request pays. Streaming gaps: most decode steps take ``decode_step``; a share ``stall_share``
also carry a prefill (or chunk) and take ``stall`` longer. A request's TPOT averages its own O gaps: in a closed
loop with fixed lengths its percentiles stay at the mean; under Poisson arrivals the gaps vary with the prompts
each step takes in (``ServePrediction.tpot_spread``), and the TPOT quantile is that of a mixture of normals, one
per output length (central limit over a request's gaps). The first token also waits for the remainder of the step
under way when the request arrives (uniform over the step: ``residual_span``), for the step its prompt joins (as
variable as a gap: ``step_sd``) and, with lengths drawn from a histogram, for its own prompt (``prefill_spread``);
the last token for its own output (``decode_spread``). TTFT and E2E are then mixtures of the wait shifted by these
independent offsets (prompt and output lengths taken as independent), whose quantile is found by bisection on the
mixture's tail.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from meshplan.cost.serve_load import ServePrediction
from meshplan.errors import SpecError

METRICS = ("ttft", "tpot", "itl", "e2e")

TINY = 1e-12
"""Seconds of waiting spread below which the wait has no tail (a femtosecond-scale mean would overflow its
exponential)."""


def wait_quantile(pred: ServePrediction, q: float) -> float:
    """The q-quantile of the wait before the prefill."""
    spread = max(pred.queue_wait - pred.wait_fixed, 0.0)
    p = pred.wait_prob
    if spread <= TINY or p <= 0 or 1 - q >= p:
        return pred.wait_fixed
    return pred.wait_fixed + spread / p * math.log(p / (1 - q))


RESIDUAL_POINTS = 7
"""Points (at the midpoints of equal shares) that stand for a continuous offset: the uniform residual of the step
an arrival lands in, the normal spread of the step its prompt joins (odd, so that the middle one is the median)."""


def wait_above(pred: ServePrediction, w: np.ndarray) -> np.ndarray:
    """P(wait > w) at each w: certain below the wait every request pays, then the exponential tail of
    ``wait_quantile``."""
    spread = max(pred.queue_wait - pred.wait_fixed, 0.0)
    if spread <= TINY or pred.wait_prob <= 0:
        return (w < pred.wait_fixed).astype(float)
    tail = pred.wait_prob * np.exp(-np.maximum(w - pred.wait_fixed, 0.0) * pred.wait_prob / spread)
    return np.where(w < pred.wait_fixed, 1.0, tail)


def _combine(*parts: tuple[tuple[float, float], ...]) -> tuple[np.ndarray, np.ndarray]:
    """Offsets and weights of the sum of independent discrete offsets (each (seconds, probability) pairs; an
    empty part is no offset)."""
    offsets, weights = np.zeros(1), np.ones(1)
    for part in parts:
        if part:
            d = np.array([x for x, _ in part])
            p = np.array([x for _, x in part]) / sum(x for _, x in part)
            offsets, weights = (offsets[:, None] + d[None, :]).ravel(), (weights[:, None] * p[None, :]).ravel()
    return offsets, weights


def residual(pred: ServePrediction) -> tuple[tuple[float, float], ...]:
    """The arrival's wait for the step (or multi-step round) under way, uniform over its span, about its mean."""
    if pred.residual_span <= 0:
        return ()
    n = RESIDUAL_POINTS
    return tuple((((i + 0.5) / n - 0.5) * pred.residual_span, 1.0 / n) for i in range(n))


def step_noise(pred: ServePrediction) -> tuple[tuple[float, float], ...]:
    """The step a prompt joins, about its mean: normal with ``step_sd``, at the quantiles of equal shares."""
    if pred.step_sd <= 0:
        return ()
    n, unit = RESIDUAL_POINTS, NormalDist()
    return tuple((unit.inv_cdf((i + 0.5) / n) * pred.step_sd, 1.0 / n) for i in range(n))


def shifted_wait_quantile(pred: ServePrediction, parts: tuple[tuple[tuple[float, float], ...], ...],
                          q: float) -> float:
    """The q-quantile of the wait plus independent offsets, each part (seconds, probability) pairs."""
    if not any(parts):
        return wait_quantile(pred, q)
    offsets, weights = _combine(*parts)
    if pred.wait_prob <= 0 or pred.queue_wait - pred.wait_fixed <= TINY:  # no tail: the offsets' weighted quantile
        order = np.argsort(offsets)
        at = int(np.searchsorted(np.cumsum(weights[order]), q - 1e-12))
        return float(offsets[order][min(at, len(order) - 1)]) + pred.wait_fixed
    lo = float(offsets.min()) + pred.wait_fixed
    hi = float(offsets.max()) + max(wait_quantile(pred, q), pred.wait_fixed)
    for _ in range(40):  # the smallest x whose tail holds at most 1 - q (to 1e-12 of the bracket)
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if float(weights @ wait_above(pred, mid - offsets)) > 1 - q else (lo, mid)
    return hi


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
    if metric == "ttft":
        parts = (residual(pred), step_noise(pred), pred.prefill_spread)
        return pred.ttft - pred.queue_wait + shifted_wait_quantile(pred, parts, q)
    if metric == "tpot":
        return tpot_quantile(pred, q)
    if metric == "e2e":
        # Beside a spread of output lengths (seconds of decode) the step's residual and noise (a step or two) are
        # left out: they would multiply the mixture's points for no visible change
        steps = () if pred.decode_spread else (residual(pred), step_noise(pred))
        parts = (*steps, pred.prefill_spread, pred.decode_spread)
        return pred.e2e - pred.queue_wait + shifted_wait_quantile(pred, parts, q)
    # ITL: the gap is a plain step unless more than 1 - q of the steps carry a prefill (per token: a speculating
    # pass's stall spreads over the tokens it yields).
    stall = pred.stall / pred.tokens_per_pass
    base = pred.tpot - pred.stall_share * stall
    gap = base + stall if pred.stall_share > 1 - q else base
    return pred.itl / max(pred.tpot, 1e-12) * gap
