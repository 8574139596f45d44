"""Pairs, not only points: published runs of the same job that differ in one or two knobs, and how well the model
predicts their ratio and their order. The planner chooses between layouts by such ratios, so a model can be off
by 10 % on both rows of a pair and still choose right, or be close on each and choose wrong.

A job is (model, GPU type, software stack): two rows of one model on one GPU type under one stack profile form a
pair when their plans differ in one or two of ``KNOBS``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from itertools import combinations

KNOBS = ("tp", "pp", "dp", "cp", "ep", "vpp", "zero", "recompute", "sp", "precision", "micro_batch",
         "global_batch", "seq_len", "schedule")
"""Plan fields a pair may differ in (the GPU count is their product: a change of dp is a change of GPUs)."""

TIE = 0.01
"""Measured step times within 1 % of each other have no order to get right."""


@dataclass(frozen=True, kw_only=True)
class Pair:
    """Two runs of one job."""

    a: str
    b: str
    knobs: tuple[str, ...]
    """What differs, e.g. ``("recompute",)``."""
    measured_ratio: float
    """t_a / t_b as published."""
    predicted_ratio: float
    """t_a / t_b as predicted."""

    @property
    def ratio_error_pct(self) -> float:
        """Signed error of the predicted ratio (%)."""
        return 100.0 * (self.predicted_ratio / self.measured_ratio - 1.0)

    @property
    def tie(self) -> bool:
        """The measured times are too close to have an order."""
        return abs(self.measured_ratio - 1.0) < TIE

    @property
    def order_right(self) -> bool:
        """The prediction orders the two runs as the measurement does (ties count as right)."""
        return self.tie or (self.predicted_ratio > 1.0) == (self.measured_ratio > 1.0)


def _knobs(run) -> dict:
    p = run.plan
    return {"tp": p.tp, "pp": p.pp, "dp": p.dp, "cp": p.cp, "ep": p.ep, "vpp": p.vpp,
            "zero": p.zero, "recompute": p.recompute, "sp": p.sp, "precision": p.precision,
            "micro_batch": p.micro_batch, "global_batch": p.global_batch, "seq_len": p.seq_len,
            "schedule": p.schedule_name if p.pp > 1 else ""}


def _job(run) -> tuple:
    return (run.model.name, run.cluster.gpu.name, run.framework.name)


def find_pairs(runs, predicted: dict[str, float], *, max_knobs: int = 2) -> list[Pair]:
    """Every pair of runs of one job differing in 1..``max_knobs`` knobs, with measured and predicted ratios
    (``predicted``: step time by run id)."""
    out = []
    for ra, rb in combinations(runs, 2):
        if _job(ra) != _job(rb):
            continue
        ka, kb = _knobs(ra), _knobs(rb)
        diff = tuple(k for k in KNOBS if ka[k] != kb[k])
        if not 1 <= len(diff) <= max_knobs:
            continue
        out.append(Pair(a=ra.id, b=rb.id, knobs=diff, measured_ratio=ra.measured_s / rb.measured_s,
                        predicted_ratio=predicted[ra.id] / predicted[rb.id]))
    return out


def summary(pairs: list[Pair]) -> dict:
    """n, median and max absolute ratio error (%), order right (ties excluded), overall and by knob."""
    def stats(ps: list[Pair]) -> dict:
        ordered = [p for p in ps if not p.tie]
        errs = [abs(p.ratio_error_pct) for p in ps]
        return {"n": len(ps), "median_ratio_error_pct": statistics.median(errs) if errs else 0.0,
                "max_ratio_error_pct": max(errs, default=0.0), "ordered": len(ordered),
                "order_right": sum(p.order_right for p in ordered)}
    by: dict[str, list[Pair]] = {}
    for p in pairs:
        by.setdefault("+".join(p.knobs), []).append(p)
    return {"all": stats(pairs), "by_knobs": {k: stats(v) for k, v in sorted(by.items())}}
