"""The schedule registry: one ``ScheduleSpec`` per pipeline schedule, one module per schedule in this folder.

Everything that names a schedule looks it up here: the cost model's closed forms and in-flight activations, the
search's bounds and options, plan validation, the runtime's torch.distributed.pipelining class, the exporters'
spellings. ``meshplan.sim.schedules`` registers one action-list generator under each name (a test holds the two
name sets equal). Adding a schedule is a module here defining ``SCHEDULE = ScheduleSpec(...)``, plus its generator.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

from meshplan.errors import SpecError, unknown_name

Work = list[tuple[float, float, float]]
"""Per pipeline rank: (forward, backward-input, backward-weight) seconds of all its chunks, one micro-batch."""


@dataclass(frozen=True, kw_only=True)
class ScheduleSpec:
    """A pipeline schedule's facts and the small analytic functions the cost model and the search use."""

    name: str
    """Registry name (a plan's ``schedule``)."""
    placement: str
    """``loop`` (stage ``chunk * pp + rank``) or ``v`` (rank r holds stages r and 2pp-1-r)."""
    chunks: tuple[int, int]
    """(least, most) chunks per rank, i.e. vpp; most 0 = no limit."""
    torch_class: str
    """The torch.distributed.pipelining class that runs the same order."""
    torchtitan: str
    """torchtitan's ``pipeline_parallel_schedule`` name."""
    closed_form_exact: bool
    """The closed form equals the event simulator on uniform stages without transfer time (m >= pp); otherwise the
    estimate simulates."""
    zero_bubble: bool
    """The backward splits into input and weight gradients (B = I + W), so the fill scales with a share."""
    forwards_first: bool
    """Every forward runs before the first backward (GPipe, Looped BFS): no forward follows a backward."""
    source: str
    """Paper (and section) the order comes from."""
    fill: Callable[[Work, int, int, int], float]
    """``fill(work, pp, vpp, n_micro)``: idle time of the slowest rank without transfers (s)."""
    fill_coefficient: Callable[[int, int, int, float], tuple[float, float]]
    """``(c, e)(pp, vpp, n_micro, share)``: the pipeline takes at least m M + c (S - M) + e M for busiest-rank work
    M and all ranks' work S per micro-batch (``share``: least zero-bubble fill per unit of work)."""
    p2p_factor: Callable[[int, int, int], float]
    """``(pp, vpp, n_micro)``: exposed transfer time per second of one stage-to-stage send (first order)."""
    inflight: Callable[[int, int, int, int, float], float]
    """``(pp, vpp, n_micro, rank, w_hold)``: micro-batches whose activations the rank holds at its peak."""
    constraint: Callable[[int, int, int], str] = lambda pp, vpp, n_micro: ""
    """``(pp, vpp, n_micro)``: why the schedule cannot run that pipeline (empty = it can)."""
    other_chunks: str = ""
    """The schedule to use for another chunk count, e.g. ``interleaved_1f1b`` for 1F1B beyond one chunk."""

    def accepts(self, *, pp: int, vpp: int, n_micro: int) -> str:
        """Why the schedule cannot run ``pp`` ranks of ``vpp`` chunks on ``n_micro`` micro-batches, or ``""``."""
        lo, hi = self.chunks
        if vpp < lo or (hi and vpp > hi):
            want = f"exactly {lo}" if lo == hi else (f"at least {lo}" if not hi else f"{lo} to {hi}")
            hint = f"; use {self.other_chunks} for vpp={vpp}" if self.other_chunks else ""
            return f"schedule {self.name} runs {want} chunk(s) per rank (vpp), the plan has vpp={vpp}{hint}"
        return self.constraint(pp, vpp, n_micro)

    def stage_rank(self, *, stage: int, pp: int) -> int:
        """Rank holding ``stage`` (pipeline order)."""
        chunk, pos = divmod(stage, pp)
        return pp - 1 - pos if self.placement == "v" and chunk % 2 == 1 else pos


@lru_cache(maxsize=1)
def _registry() -> dict[str, ScheduleSpec]:
    out = {}
    for info in pkgutil.iter_modules(__path__):
        spec = getattr(importlib.import_module(f"{__name__}.{info.name}"), "SCHEDULE", None)
        if isinstance(spec, ScheduleSpec):
            out[spec.name] = spec
    return out


def schedule_names() -> list[str]:
    """Every registered schedule name."""
    return sorted(_registry())


def schedule_spec(name: str) -> ScheduleSpec:
    """The spec of ``name``; an unknown name raises SpecError with close matches. A CSV schedule (a file of
    actions, which the simulator reads with its own placement) takes 1F1B's looped placement here; its time
    always comes from the simulator (``closed_form_exact`` is False for it in ``needs_simulation``)."""
    reg = _registry()
    spec = reg.get(name)
    if spec is not None:  # the common case first: the search asks this ~10^5 times per plan
        return spec
    if is_csv(name):
        return reg["1f1b"]
    raise unknown_name("schedule", name, reg)


def is_csv(name: str) -> bool:
    """A schedule given as a torch.distributed.pipelining CSV file rather than a registered name."""
    return name.lower().endswith(".csv")


def check_schedule_name(name: str) -> None:
    """Raise SpecError unless ``name`` is empty (the default), registered, or a CSV file."""
    if name and not is_csv(name) and name not in _registry():
        err = unknown_name("schedule", name, _registry())
        raise SpecError("plan.schedule", name, err.expected + " or a .csv file", err.suggestions)


@lru_cache(maxsize=4096)
def rank_stages(name: str, *, pp: int, n_stages: int) -> tuple[tuple[int, ...], ...]:
    """Stages held by each rank, in pipeline order (computed once per placement; search calls it often)."""
    spec = schedule_spec(name)
    out: list[list[int]] = [[] for _ in range(pp)]
    for s in range(n_stages):
        out[spec.stage_rank(stage=s, pp=pp)].append(s)
    return tuple(tuple(x) for x in out)


def bound_factor(name: str, *, pp: int, vpp: int, n_micro: int, share: float = 0.0) -> float:
    """Lower bound of pipeline time in units of the average rank's work per micro-batch, for any split: with
    M >= S / p in m M + c (S - M) + e M (``fill_coefficient``; m >= c), m + c (p - 1) + e."""
    if pp == 1:
        return float(n_micro)
    c, e = schedule_spec(name).fill_coefficient(pp, vpp, n_micro, share)
    return n_micro + c * (pp - 1) + e


def needs_simulation(name: str, *, pp: int, uneven: bool) -> bool:
    """The estimate must simulate this pipeline: a schedule whose closed form is not exact, a CSV schedule, or
    an uneven layer split (the closed forms are exact on uniform stages only)."""
    if pp == 1:
        return False
    return is_csv(name) or uneven or not schedule_spec(name).closed_form_exact
