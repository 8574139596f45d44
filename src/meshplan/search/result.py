"""What a search returns: ranked plans with their estimates, the time/memory Pareto front, counts of what was
considered and pruned (by reason), and, when nothing fits, a typed infeasible result with the leanest plan."""

from __future__ import annotations

from dataclasses import dataclass, field

from meshplan.cost.result import Estimate
from meshplan.errors import Infeasible
from meshplan.search.request import SearchRequest
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import Plan


@dataclass(frozen=True, kw_only=True)
class RankedPlan:
    """One evaluated plan."""

    plan: Plan
    """The layout."""
    cluster: ClusterSpec
    """The GPUs it runs on (a mixed cluster's pools in stage order, idle pools left out)."""
    estimate: Estimate
    """Full cost model, closed-form pipeline."""
    simulated: Estimate | None = None
    """Same with the event simulator for the pipeline (top plans only)."""
    dollars_per_hour: float = 0.0
    """Price of the GPUs it occupies (0 = unknown)."""

    @property
    def best(self) -> Estimate:
        """The estimate used for ranking: simulated when available."""
        return self.simulated or self.estimate

    @property
    def step_time(self) -> float:
        """Predicted seconds per step."""
        return self.best.step_time

    @property
    def tokens_per_dollar(self) -> float:
        """Training tokens per unit of currency (0 without prices)."""
        if self.dollars_per_hour <= 0:
            return 0.0
        return self.best.tokens_per_s * 3600.0 / self.dollars_per_hour


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    """Outcome of ``meshplan.search.search``."""

    model: ModelSpec
    """The model."""
    cluster: ClusterSpec
    """The cluster as given."""
    request: SearchRequest
    """The request."""
    plans: tuple[RankedPlan, ...]
    """Top plans, best first."""
    fitting: tuple[RankedPlan, ...] = ()
    """Every fitting plan the search evaluated (closed-form estimates)."""
    front: tuple[RankedPlan, ...] = ()
    """The time/memory Pareto front of the fitting plans, fastest first, timed as ``plans`` are
    (``meshplan.search.rank.pareto``)."""
    considered: int
    """Candidates enumerated (leaves plus whole degree tuples rejected before their leaves)."""
    pruned: dict = field(default_factory=dict)
    """Candidates discarded, by reason."""
    evaluated: int = 0
    """Full cost-model evaluations run."""
    search_time_s: float = 0.0
    """Wall time of the search (s)."""
    infeasible: Infeasible | None = None
    """Set when no plan fits: the reason, the leanest plan's breakdown and the GPUs needed."""
    lean: RankedPlan | None = None
    """The most memory-lean plan found (reported when nothing fits)."""

    @property
    def best(self) -> RankedPlan | None:
        """The winner, or None."""
        return self.plans[0] if self.plans else None
