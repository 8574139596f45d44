"""Shared builders for the simulator tests."""

from __future__ import annotations

from meshplan.cost.result import StageTimes


def uniform(n_stages: int, *, f: float = 1.0, i: float = 1.0, w: float = 1.0, t: float = 0.0,
            act: float = 1.0, dp_tail: tuple[float, ...] = ()) -> StageTimes:
    """Equal stages: forward f, backward-input i, backward-weight w, sends t (s), act bytes per stage."""
    return StageTimes(fwd=(f,) * n_stages, bwd_input=(i,) * n_stages, bwd_weight=(w,) * n_stages,
                      p2p=(t,) * (n_stages - 1) + (0.0,), act_bytes=(act,) * n_stages, dp_tail=dp_tail)
