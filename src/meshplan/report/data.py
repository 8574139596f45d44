"""What a report shows: one plan with its estimate and simulated step, optional alternatives, and the Pareto
front of step time vs peak memory over all of them. Both renderers (HTML, text) read only this."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable

from meshplan.cost.result import Estimate, pareto_front
from meshplan.sim.timeline import Timeline
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import Plan

SEARCH_KIND = "runners-up of the plan search"
VARIANT_KIND = "variants of this plan"


@dataclass(frozen=True, kw_only=True)
class Alternative:
    """Another plan for the same model and cluster, with its own estimate."""

    label: str
    """Short name shown in tables and hovers, e.g. ``recompute=full`` or ``#2``."""
    plan: Plan
    """The layout."""
    estimate: Estimate
    """Its prediction (same cost model as the reported plan)."""


@dataclass(frozen=True, kw_only=True)
class Report:
    """Everything a report renders; build it with :func:`build_report`."""

    model: ModelSpec
    """The model trained."""
    cluster: ClusterSpec
    """The GPUs."""
    plan: Plan
    """The reported plan."""
    estimate: Estimate
    """Its prediction."""
    timeline: Timeline
    """One simulated optimizer step of its pipeline (a 1-rank timeline when pp = 1)."""
    alternatives: tuple[Alternative, ...] = ()
    """Other plans to compare against (search runners-up or variants of the plan)."""
    alternatives_kind: str = VARIANT_KIND
    """What the alternatives are, in words (``SEARCH_KIND`` or ``VARIANT_KIND``)."""
    memory_limit: float | None = None
    """Planner's peak-memory limit per GPU (bytes); None = device capacity only."""
    pareto: tuple[int, ...] = ()
    """Indices on the Pareto front over ``points()`` (0 = the reported plan), fastest first."""
    skipped: tuple[str, ...] = ()
    """Alternatives that could not be evaluated, each with its reason."""

    @property
    def limit(self) -> float:
        """Bytes a plan may use per GPU: the planner's limit, else device capacity."""
        return self.memory_limit if self.memory_limit is not None else self.estimate.capacity

    def points(self) -> list[tuple[str, float, float]]:
        """(label, step time s, peak bytes) of the reported plan followed by each alternative."""
        est = self.estimate
        out = [("this plan", est.step_time, est.peak_memory)]
        out += [(a.label, a.estimate.step_time, a.estimate.peak_memory) for a in self.alternatives]
        return out


def build_report(model: ModelSpec, cluster: ClusterSpec, plan: Plan, est: Estimate, timeline: Timeline, *,
                 alternatives: Iterable = (), alternatives_kind: str = VARIANT_KIND,
                 memory_limit: float | None = None, skipped: Iterable[str] = ()) -> Report:
    """Collect a plan, its estimate and timeline, and alternatives into a Report with its Pareto front.

    Args:
        alternatives: ``Alternative`` objects or ``(label, Plan, Estimate)`` tuples.
        alternatives_kind: what the alternatives are (shown as the section title).
        memory_limit: the planner's per-GPU memory limit (bytes), drawn and used to judge fit.
        skipped: readable reasons for alternatives that could not be evaluated.

    The Pareto front covers only plans within the memory limit (a plan that does not fit is no trade-off).
    """
    alts = tuple(a if isinstance(a, Alternative) else Alternative(label=a[0], plan=a[1], estimate=a[2])
                 for a in alternatives)
    rep = Report(model=model, cluster=cluster, plan=plan, estimate=est, timeline=timeline, alternatives=alts,
                 alternatives_kind=alternatives_kind, memory_limit=memory_limit, skipped=tuple(skipped))
    pts = rep.points()
    fits = [i for i, (_, _, mem) in enumerate(pts) if mem <= rep.limit]
    front = pareto_front([(pts[i][1], pts[i][2]) for i in fits])
    return replace(rep, pareto=tuple(fits[j] for j in front))


def from_search(result, *, timeline: Timeline, index: int = 0) -> Report:
    """A report of the ``index``-th ranked plan of a plan search, the other ranked plans as runners-up.

    ``result`` is a ``meshplan.search`` result (duck-typed: ``plans`` of objects with ``plan``, ``best``
    (an Estimate), ``cluster``; ``model``; ``request.max_memory_fraction``). The caller simulates the chosen
    plan's step and passes it as ``timeline``.
    """
    chosen = result.plans[index]
    others = [(f"#{i + 1}", rp.plan, rp.best) for i, rp in enumerate(result.plans) if i != index]
    frac = getattr(getattr(result, "request", None), "max_memory_fraction", None)
    limit = frac * chosen.best.capacity if frac is not None else None
    return build_report(result.model, chosen.cluster, chosen.plan, chosen.best, timeline,
                        alternatives=others, alternatives_kind=SEARCH_KIND, memory_limit=limit)

