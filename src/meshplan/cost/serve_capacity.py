"""The highest Poisson arrival rate a deployment sustains within latency bounds at a percentile.

This is how MLPerf Inference's Server scenario is run: LoadGen issues queries as a Poisson process at the
submitter's target QPS, and a run is valid only if the p99 TTFT and p99 TPOT stay within the benchmark's
constraints (mlcommons/inference mlperf.conf, ``llama2-70b.Server.ttft_latency`` / ``tpot_latency``); submitters
raise the target until it would fail, so the published QPS is the sustainable rate. The same question, "how much
load does this layout hold under my SLOs", is what a serving user asks of any deployment.

Both percentiles grow with the rate (more resident requests make every decode step longer; a busier prefill
queue makes arrivals wait), so the bound is found by bisection between zero and the offline throughput.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from meshplan.cost.serve_load import ServePrediction, predict_load
from meshplan.cost.serve_step import StepContext
from meshplan.cost.serve_tail import quantile
from meshplan.spec.serving import Workload

ITERATIONS = 24
"""Bisection steps: the bracket shrinks to 2^-24 (6e-8) of the offline throughput."""


@dataclass(frozen=True, kw_only=True)
class Capacity:
    """The sustainable rate and the steady state at it."""

    rate: float
    """Requests per second of the whole deployment (0 when even a trickle misses a bound)."""
    prediction: ServePrediction | None
    """The steady state at ``rate`` (None when the rate is 0)."""
    binding: str
    """Which bound stops a higher rate: ``ttft``, ``tpot`` or ``saturation`` (the offline throughput)."""


def _misses(pred: ServePrediction, *, ttft: float, tpot: float, q: float) -> str:
    """The bound ``pred`` breaks at the q-quantile ('' when it keeps both)."""
    if quantile(pred, "tpot", q) > tpot:
        return "tpot"
    if quantile(pred, "ttft", q) > ttft:
        return "ttft"
    return ""


def sustainable_rate(ctx: StepContext, work: Workload, *, replicas: int, ttft: float, tpot: float,
                     q: float, iterations: int = ITERATIONS) -> Capacity:
    """The highest Poisson rate over ``replicas`` whose q-quantile TTFT and TPOT stay within ``ttft`` and
    ``tpot`` (s), with ``work``'s lengths (its own load is ignored), to 2^-``iterations`` of the offline
    throughput."""
    offline = predict_load(ctx, replace(work, rate=0.0, concurrency=0), replicas=replicas)
    top = offline.requests_per_s
    at_top = predict_load(ctx, replace(work, rate=top * (1 - 2.0 ** -iterations), concurrency=0), replicas=replicas)
    if not _misses(at_top, ttft=ttft, tpot=tpot, q=q):
        return Capacity(rate=at_top.requests_per_s, prediction=at_top, binding="saturation")
    lo, hi, best, binding = 0.0, top, None, ""
    for _ in range(iterations):
        mid = (lo + hi) / 2
        pred = predict_load(ctx, replace(work, rate=mid, concurrency=0), replicas=replicas)
        missed = _misses(pred, ttft=ttft, tpot=tpot, q=q)
        if missed:
            hi, binding = mid, missed
        else:
            lo, best = mid, pred
    return Capacity(rate=lo, prediction=best, binding=binding or "ttft")
