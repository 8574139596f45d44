"""How far an open loop's resident batch wanders from its mean, and what that does to each request's TPOT.

Under Poisson arrivals the number of requests resident on a replica is a birth-death process: arrivals at rate
lambda, departures at the throughput X(R) the engine reaches with R resident (R / cycle(R),
``serve_load.steady_state``). Linearised about its fixed point X(R*) = lambda (van Kampen's linear-noise
approximation, van Kampen 1961), R is an Ornstein-Uhlenbeck process that relaxes at the rate X'(R*) with variance
lambda / X'(R*); for a server whose throughput is proportional to R (M/G/infinity, X' = 1 / E[S]) that is the
Poisson variance lambda E[S]. Where the throughput curve flattens towards saturation X' is small and the batch
wanders far. A request's TPOT follows the batch it shares, T(R), averaged over its own lifetime L: the time average
of an Ornstein-Uhlenbeck process over L keeps 2 (x - 1 + e^-x) / x^2 of its variance, x = L X'(R*).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from meshplan.cost.serve_step import StepContext
from meshplan.spec.serving import Workload

Steady = Callable[[StepContext, Workload, int], tuple[float, float, float, float]]
"""``serve_load.steady_state``: (decode step, prefill step, cycle, token time) at a resident count."""


@dataclass(frozen=True, kw_only=True)
class Wander:
    """The resident batch's wandering about its fixed point R*."""

    sd: float
    """Standard deviation of the resident count (requests)."""
    relax: float
    """Rate at which a departure from R* decays, X'(R*) (1/s)."""
    slope: float
    """Token time per extra resident request, T'(R*) (s)."""

    def tpot_sd(self, lifetime: float) -> float:
        """Standard deviation of the TPOT of a request resident for ``lifetime`` seconds, from the batch alone."""
        x = lifetime * self.relax
        kept = 1.0 if x < 1e-6 else 2.0 * (x - 1.0 + math.exp(-x)) / (x * x)
        return self.slope * self.sd * math.sqrt(kept)


def wander(ctx: StepContext, work: Workload, steady: Steady, *, resident: int, cap: int,
           rate: float) -> Wander | None:
    """The wandering of ``resident`` requests fed ``rate`` arrivals/s on one replica (None when the batch is pinned
    at its ``cap``, or the load is not an open loop): X' and T' by central differences over a twentieth of R*."""
    if rate <= 0 or resident < 2 or resident >= cap:
        return None
    step = max(resident // 20, 1)
    lo, hi = resident - step, min(resident + step, cap)
    (_, _, cycle_lo, t_lo), (_, _, cycle_hi, t_hi) = steady(ctx, work, lo), steady(ctx, work, hi)
    relax = (hi / cycle_hi - lo / cycle_lo) / (hi - lo)
    if relax <= 0:
        return None
    return Wander(sd=math.sqrt(rate / relax), relax=relax, slope=max((t_hi - t_lo) / (hi - lo), 0.0))
