"""Registry of schedule generators. Adding a schedule is adding a module with a generator
``f(*, pp, vpp, n_micro) -> Schedule`` and one entry in ``_REGISTRY``."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable

from meshplan.errors import SpecError, unknown_name
from meshplan.sim.schedule import Schedule
from meshplan.sim.schedules.dualpipe import dualpipev
from meshplan.sim.schedules.gpipe import gpipe
from meshplan.sim.schedules.interleaved import interleaved_1f1b
from meshplan.sim.schedules.one_f_one_b import one_f_one_b
from meshplan.sim.schedules.zero_bubble import zb_h1, zbv


@dataclass(frozen=True, kw_only=True)
class ScheduleEntry:
    """A registered schedule family."""

    generate: Callable[..., Schedule]
    """``generate(*, pp, vpp, n_micro) -> Schedule``."""
    torch_class: str
    """The torch.distributed.pipelining class that runs the same order (for exporters and the runtime)."""
    placement: str
    """``loop`` (stage chunk*pp + rank) or ``v`` (rank r holds stages r and 2pp-1-r)."""
    source: str
    """Paper the order comes from."""


_REGISTRY = MappingProxyType({
    "gpipe": ScheduleEntry(generate=gpipe, torch_class="ScheduleGPipe", placement="loop",
                           source="Huang et al. 2019"),
    "1f1b": ScheduleEntry(generate=one_f_one_b, torch_class="Schedule1F1B", placement="loop",
                          source="Narayanan et al. 2021 sec. 2.2.1"),
    "interleaved_1f1b": ScheduleEntry(generate=interleaved_1f1b, torch_class="ScheduleInterleaved1F1B",
                                      placement="loop", source="Narayanan et al. 2021 sec. 2.2.2"),
    "zb_h1": ScheduleEntry(generate=zb_h1, torch_class="ScheduleInterleavedZeroBubble", placement="loop",
                           source="Qi et al. 2023 sec. 3.1"),
    "zbv": ScheduleEntry(generate=zbv, torch_class="ScheduleZBVZeroBubble", placement="v",
                         source="Qi et al. 2024 sec. 6"),
    "dualpipev": ScheduleEntry(generate=dualpipev, torch_class="ScheduleDualPipeV", placement="v",
                               source="DeepSeek-AI 2024 sec. 3.2.1"),
})


def schedule_names() -> list[str]:
    """Names of every registered schedule."""
    return sorted(_REGISTRY)


def schedule_entry(name: str) -> ScheduleEntry:
    """The registry entry of ``name``; unknown names raise SpecError with close matches."""
    if name not in _REGISTRY:
        raise unknown_name("schedule", name, _REGISTRY)
    return _REGISTRY[name]


def get_schedule(name: str, *, pp: int, vpp: int, n_micro: int) -> Schedule:
    """Generate the action lists of a registered schedule.

    Args:
        name: registry name, e.g. ``1f1b``.
        pp: pipeline ranks.
        vpp: chunks (virtual stages) per rank.
        n_micro: micro-batches per step.
    """
    entry = schedule_entry(name)
    for field, value in (("plan.pp", pp), ("plan.vpp", vpp), ("n_micro", n_micro)):
        if not isinstance(value, int) or value < 1:
            raise SpecError(field, value, "must be an integer >= 1")
    return entry.generate(pp=pp, vpp=vpp, n_micro=n_micro)
