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
from functools import lru_cache

from meshplan.errors import SpecError

BINS = 12
"""Equal-probability bins of a histogram built from statistics (12: the 8 % tail keeps a bin of its own)."""
SIGMA_MAX = 20.0
"""Widest log-normal the fit tries (a median / mean far below 0.01 is no length distribution a harness samples)."""


def _log_phi(z: float) -> float:
    """log of the standard normal CDF, exact deep in the lower tail: erfc down to z = -30, then the asymptotic
    series (Abramowitz & Stegun 26.2.12) where erfc would underflow."""
    if z > -30:
        return math.log(0.5 * math.erfc(-z / math.sqrt(2)))
    return -z * z / 2 - math.log(-z) - 0.5 * math.log(2 * math.pi) + math.log1p(-1 / (z * z) + 3 / z ** 4)


def _log_mass(za: float, zb: float) -> float:
    """log P(za < Z < zb), taken on the lower tail's side (P(za < Z < zb) = P(-zb < Z < -za)) so that neither
    end is a number near 1; -inf when the interval is empty."""
    if za > 0:
        za, zb = -zb, -za
    la, lb = _log_phi(za), _log_phi(zb)
    return lb + math.log1p(-math.exp(la - lb)) if la < lb else -math.inf


def _z(x: float, mu: float, sigma: float) -> float:
    return (math.log(x) - mu) / sigma


def _partial_mean(mu: float, sigma: float, za: float, zb: float) -> float:
    """E[X | za < Z < zb] for X = exp(mu + sigma Z): exp(mu + sigma^2 / 2) P(za - sigma < Z < zb - sigma) /
    P(za < Z < zb), in logs (the bisections visit wide fits far from the range), within the interval's ends."""
    mean = math.exp(min(mu + sigma * sigma / 2 + _log_mass(za - sigma, zb - sigma) - _log_mass(za, zb), 700.0))
    return min(max(mean, math.exp(mu + sigma * za)), math.exp(mu + sigma * zb))


def _truncated_mean(mu: float, sigma: float, lo: float, hi: float) -> float:
    """Mean of a log-normal(mu, sigma) truncated to [lo, hi] (the partial expectation over the mass kept)."""
    return _partial_mean(mu, sigma, _z(lo, mu, sigma), _z(hi, mu, sigma))


def _share_below(x: float, mu: float, sigma: float, lo: float, hi: float) -> float:
    """P(X <= x) of the log-normal truncated to [lo, hi]."""
    za = _z(lo, mu, sigma)
    return math.exp(_log_mass(za, _z(x, mu, sigma)) - _log_mass(za, _z(hi, mu, sigma)))


def _mu_for_median(median: float, sigma: float, lo: float, hi: float) -> float:
    """The mu whose truncation to [lo, hi] has ``median`` as its median (monotone in mu: bisection)."""
    a, b = math.log(lo) - 40 * sigma, math.log(hi) + 40 * sigma
    for _ in range(100):
        mu = (a + b) / 2
        a, b = (mu, b) if _share_below(median, mu, sigma, lo, hi) > 0.5 else (a, mu)
    return (a + b) / 2


def _quantile_z(q: float, mu: float, sigma: float, lo: float, hi: float) -> float:
    """The z at which the truncated log-normal's CDF reaches q (bisection in z: tail probabilities below any float
    that inv_cdf takes stay exact in logs)."""
    a, b = _z(lo, mu, sigma), _z(hi, mu, sigma)
    for _ in range(100):
        z = (a + b) / 2
        a, b = (z, b) if _share_below(math.exp(mu + sigma * z), mu, sigma, lo, hi) < q else (a, z)
    return (a + b) / 2


def lognormal_fit(mean: float, median: float, lo: float, hi: float, where: str = "lengths") -> tuple[float, float]:
    """(mu, sigma) of the log-normal truncated to [lo, hi] with this mean and median (``where`` names the field a
    refusal is about)."""
    if not lo < median < mean < hi:
        raise SpecError(where, f"median {median:g}, mean {mean:g}, range {lo:g}-{hi:g}",
                        "need shortest < median < mean < longest (a right-skewed length distribution)")
    s_lo, s_hi = 1e-3, SIGMA_MAX
    for _ in range(100):  # at a fixed median the truncated mean grows with sigma
        sigma = (s_lo + s_hi) / 2
        m = _truncated_mean(_mu_for_median(median, sigma, lo, hi), sigma, lo, hi)
        s_lo, s_hi = (sigma, s_hi) if m < mean else (s_lo, sigma)
    sigma = (s_lo + s_hi) / 2
    mu = _mu_for_median(median, sigma, lo, hi)
    off_mean = abs(_truncated_mean(mu, sigma, lo, hi) - mean) > 1e-4 * mean  # the bounds cap how far it reaches
    if off_mean or abs(_share_below(median, mu, sigma, lo, hi) - 0.5) > 1e-3:
        raise SpecError(where, f"median {median:g}, mean {mean:g}, range {lo:g}-{hi:g}",
                        "no log-normal within the range has this mean and this median")
    return mu, sigma


@lru_cache(maxsize=64)
def lognormal_bins(mean: float, median: float, lo: float, hi: float, bins: int = BINS) -> tuple[tuple[int, float], ...]:
    """``bins`` equal-probability (length, weight) bins of the truncated log-normal through ``mean`` and ``median``,
    each at its conditional mean (so the histogram keeps the mean)."""
    mu, sigma = lognormal_fit(mean, median, lo, hi)
    edges = [_z(lo, mu, sigma), *(_quantile_z(i / bins, mu, sigma, lo, hi) for i in range(1, bins)),
             _z(hi, mu, sigma)]
    return tuple((min(max(int(round(_partial_mean(mu, sigma, a, b))), int(lo)), int(hi)), 1.0 / bins)
                 for a, b in zip(edges[:-1], edges[1:]))
