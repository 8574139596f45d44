"""Closed-form pieces shared by several schedules (the registry's modules compose them)."""

from __future__ import annotations


def looped_fill(work, c: float, e: float) -> float:
    """``c (sum_r W_r - max_r W_r) + e max_r W_r`` over the ranks' work per micro-batch (Narayanan et al. 2021
    eq. 1, unequal stages; the interleaved drain term when m < p)."""
    total = [sum(w) for w in work]
    return c * (sum(total) - max(total)) + e * max(total)


def zero_bubble_fill(work, halve: bool) -> float:
    """``sum_r f_r - max_r f_r`` with each rank's fill f_r = max(F + I - W, I) (Qi et al. 2023 sec. 3.1), halved
    for the V-shaped schedules (Qi et al. 2024 sec. 6; DeepSeek-AI 2024 table 2)."""
    per = [max(f + i - w, i) for f, i, w in work]
    fill = sum(per) - max(per)
    return fill / 2 if halve else fill


def one_f_one_b_inflight(pp: int, n_micro: int, rank: int) -> float:
    """1F1B keeps p - r micro-batches in flight (Narayanan et al. 2021, sec. 2.2.1), at most m."""
    return float(min(pp - rank, n_micro))


def interleave_rounds_ok(pp: int, n_micro: int) -> bool:
    """torch's interleaved schedules take micro-batches in max(1, m // pp) rounds, which must divide m."""
    rounds = max(1, n_micro // pp)
    return n_micro % rounds == 0
