"""Schedule generators: one action-list generator ``f(*, pp, vpp, n_micro) -> Schedule`` per registered schedule,
under the same name as its ``ScheduleSpec`` in ``meshplan.spec.schedules`` (a test holds the name sets equal).
A module here lists its generators in ``GENERATORS = {name: function}``; adding a schedule is its spec module plus
a generator here."""

from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache
from typing import Callable

from meshplan.errors import SpecError, unknown_name
from meshplan.sim.schedule import Schedule
from meshplan.spec.schedules import schedule_spec


@lru_cache(maxsize=1)
def _generators() -> dict[str, Callable[..., Schedule]]:
    out: dict[str, Callable[..., Schedule]] = {}
    for info in pkgutil.iter_modules(__path__):
        out.update(getattr(importlib.import_module(f"{__name__}.{info.name}"), "GENERATORS", {}))
    return out


def schedule_names() -> list[str]:
    """Names of every schedule with a generator."""
    return sorted(_generators())


def get_schedule(name: str, *, pp: int, vpp: int, n_micro: int) -> Schedule:
    """Generate the action lists of a registered schedule.

    Args:
        name: registry name, e.g. ``1f1b``.
        pp: pipeline ranks.
        vpp: chunks (virtual stages) per rank.
        n_micro: micro-batches per step.
    """
    gens = _generators()
    if name not in gens:
        raise unknown_name("schedule", name, gens)
    for field, value in (("plan.pp", pp), ("plan.vpp", vpp), ("n_micro", n_micro)):
        if not isinstance(value, int) or value < 1:
            raise SpecError(field, value, "must be an integer >= 1")
    why = schedule_spec(name).accepts(pp=pp, vpp=vpp, n_micro=n_micro)
    if why:
        raise SpecError(f"schedule {name}", (pp, vpp, n_micro), why)
    return gens[name](pp=pp, vpp=vpp, n_micro=n_micro)
