"""How well predictions rank reality: the closed loop's space of plans and its agreement statistics (rank
correlation, error, regret). Torch-free, so ``meshplan check`` plans and scores without starting a worker."""

from __future__ import annotations

from dataclasses import dataclass, field

from meshplan import catalog
from meshplan.spec.framework import FrameworkProfile


@dataclass(frozen=True, kw_only=True)
class CheckSpace:
    """Which plans ``check`` enumerates for one world size and workload."""

    world: int
    """Processes (devices) in the local world."""
    global_batch: int
    """Sequences per step."""
    seq_len: int
    """Tokens per sequence."""
    recompute: tuple[str, ...] = ("none", "selective", "full")
    """Recompute modes to cross with every layout."""
    micro_batches: tuple[int, ...] = ()
    """Micro-batch sizes to cross with every layout (empty = the largest that fits the layout, and half)."""
    precision: str = "fp32"
    """Compute precision of every plan (fp32 on a CPU)."""
    stack: FrameworkProfile = field(default_factory=lambda: catalog.framework("meshplan"))
    """The runtime's profile (eager PyTorch, FSDP2, foreach AdamW), as ``meshplan run`` runs every plan."""
    schedules: tuple[str, ...] = ("gpipe", "1f1b", "interleaved_1f1b")
    """Pipeline schedules tried for pp > 1, each at its least chunk count (interleaving at vpp 2)."""


def kendall_tau(xs: list[float], ys: list[float]) -> float:
    """Kendall's tau-b rank correlation (Kendall 1945: ties in either list shrink the denominator).

    Example: [1, 2, 3] vs [1, 3, 2] has 2 concordant and 1 discordant pair: tau = 1/3.
    """
    n = len(xs)
    conc = disc = tx = ty = 0
    for i in range(n):
        for j in range(i + 1, n):
            a, b = xs[i] - xs[j], ys[i] - ys[j]
            if a == 0 and b == 0:
                continue
            if a == 0:
                tx += 1
            elif b == 0:
                ty += 1
            elif (a > 0) == (b > 0):
                conc += 1
            else:
                disc += 1
    denom = ((conc + disc + tx) * (conc + disc + ty)) ** 0.5
    return (conc - disc) / denom if denom else 0.0


def ranks(xs: list[float]) -> list[int]:
    """1-based rank of each value, fastest (smallest) first; ties share the better rank."""
    return [1 + sum(1 for y in xs if y < x) for x in xs]


def mape_pct(pred: list[float], meas: list[float]) -> float:
    """Mean absolute percentage error of predictions against measurements (%)."""
    return 100.0 * sum(abs(p - m) / m for p, m in zip(pred, meas)) / len(meas)


def regret_pct(pred: list[float], meas: list[float]) -> float:
    """How much slower the predicted-fastest plan really is than the really fastest one (%)."""
    chosen = min(range(len(pred)), key=lambda i: pred[i])
    return 100.0 * (meas[chosen] / min(meas) - 1.0)
