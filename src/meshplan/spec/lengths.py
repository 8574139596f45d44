"""Request-length histograms from a dataset's published statistics, where no histogram is published.

A benchmark dataset sometimes publishes only its mean length and a median (ShareGPT as the serving harnesses sample
it). Its lengths are then taken as a log-normal through both, truncated to the lengths the harness keeps, and cut
into equal-probability bins, each at its conditional mean: reply lengths of chat corpora are right-skewed with a
median well below the mean (median / mean 0.59 for ShareGPT replies), which a log-normal holds with one shape
parameter (a log-normal's median / mean is exp(-sigma^2 / 2); Johnson, Kotz & Balakrishnan, *Continuous Univariate
Distributions* vol. 1, ch. 14, eq. 14.8a and the truncated moments of sec. 14.4). The tail beyond what the two
statistics fix is the family's, not measured: a p99 from such a histogram is a shape assumption.
"""

from __future__ import annotations

import math
from statistics import NormalDist

from meshplan.errors import SpecError

_N = NormalDist()
BINS = 12
"""Equal-probability bins of a histogram built from statistics (12: the 8 % tail keeps a bin of its own)."""


def _phi(z: float) -> float:
    return 0.0 if z == -math.inf else 1.0 if z == math.inf else _N.cdf(z)


def _z(x: float, mu: float, sigma: float) -> float:
    return (math.log(x) - mu) / sigma


def _truncated_mean(mu: float, sigma: float, lo: float, hi: float) -> float:
    """Mean of a log-normal(mu, sigma) truncated to [lo, hi] (the partial expectation over the mass kept)."""
    za, zb = _z(lo, mu, sigma), _z(hi, mu, sigma)
    return math.exp(mu + sigma * sigma / 2) * (_phi(zb - sigma) - _phi(za - sigma)) / (_phi(zb) - _phi(za))


def _mu_for_median(median: float, sigma: float, lo: float, hi: float) -> float:
    """The mu whose truncation to [lo, hi] has ``median`` as its median (monotone in mu: bisection)."""
    a, b = math.log(lo) - 10 * sigma, math.log(hi) + 10 * sigma
    for _ in range(100):
        mu = (a + b) / 2
        za, zb = _z(lo, mu, sigma), _z(hi, mu, sigma)
        share = (_phi(_z(median, mu, sigma)) - _phi(za)) / (_phi(zb) - _phi(za))
        a, b = (mu, b) if share > 0.5 else (a, mu)
    return (a + b) / 2


def lognormal_fit(mean: float, median: float, lo: float, hi: float) -> tuple[float, float]:
    """(mu, sigma) of the log-normal truncated to [lo, hi] with this mean and median."""
    if not lo <= median < mean < hi:
        raise SpecError("lengths", f"median {median:g}, mean {mean:g}, range {lo:g}-{hi:g}",
                        "need lo <= median < mean < hi (a right-skewed length distribution)")
    s_lo, s_hi = 1e-3, 5.0
    for _ in range(100):  # at a fixed median the truncated mean grows with sigma
        sigma = (s_lo + s_hi) / 2
        m = _truncated_mean(_mu_for_median(median, sigma, lo, hi), sigma, lo, hi)
        s_lo, s_hi = (sigma, s_hi) if m < mean else (s_lo, sigma)
    sigma = (s_lo + s_hi) / 2
    mu = _mu_for_median(median, sigma, lo, hi)
    if abs(_truncated_mean(mu, sigma, lo, hi) - mean) > 1e-4 * mean:  # the bounds cap how far the mean can reach
        raise SpecError("lengths", f"median {median:g}, mean {mean:g}, range {lo:g}-{hi:g}",
                        "no log-normal within the range has both: the mean is too far above the median for it")
    return mu, sigma


def lognormal_bins(mean: float, median: float, lo: float, hi: float, bins: int = BINS) -> tuple[tuple[int, float], ...]:
    """``bins`` equal-probability (length, weight) bins of the truncated log-normal through ``mean`` and ``median``,
    each at its conditional mean (so the histogram keeps the mean)."""
    mu, sigma = lognormal_fit(mean, median, lo, hi)
    pa, pb = _phi(_z(lo, mu, sigma)), _phi(_z(hi, mu, sigma))
    edges = [_z(lo, mu, sigma)] + [_N.inv_cdf(pa + (pb - pa) * i / bins) for i in range(1, bins)] + [_z(hi, mu, sigma)]
    out = []
    for za, zb in zip(edges[:-1], edges[1:]):
        cond = math.exp(mu + sigma * sigma / 2) * (_phi(zb - sigma) - _phi(za - sigma)) / (_phi(zb) - _phi(za))
        out.append((max(int(round(cond)), 1), 1.0 / bins))
    return tuple(out)
