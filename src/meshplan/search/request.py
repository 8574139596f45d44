"""What a search is asked: the workload, the limits, the objective, and the degrees the user pinned."""

from __future__ import annotations

from dataclasses import dataclass, field

from meshplan import catalog
from meshplan.cost.memory_limits import stack_limit
from meshplan.errors import SpecError
from meshplan.spec.framework import FrameworkProfile
from meshplan.spec.plan import DEFAULT_FRAMEWORK, MAX_COUNT, PRECISIONS

OBJECTIVES = ("time", "cost", "robust")
PIN_FIELDS = ("tp", "sp", "cp", "cp_kind", "pp", "vpp", "schedule", "dp", "zero", "dp_shard", "ep", "etp",
              "micro_batch", "recompute", "recompute_layers", "rank_order")


@dataclass(frozen=True, kw_only=True)
class SearchRequest:
    """Workload, limits and objective of one planning run."""

    global_batch: int
    """Sequences per optimizer step."""
    seq_len: int
    """Tokens per sequence."""
    precision: str = "bf16"
    """Compute precision (``bf16``, ``fp16``, ``fp32``, ``fp8``)."""
    framework: FrameworkProfile = field(default_factory=lambda: catalog.framework(DEFAULT_FRAMEWORK))
    """The software stack every plan runs under (its behaviour, and the layouts it can run at all)."""
    max_memory_fraction: float | None = None
    """Largest predicted peak per GPU as a share of its device memory (may exceed 1 to reproduce a layout);
    None: the stack's limit from its published runs (``cost.memory_limits``), set here on construction."""
    memory_limit_why: str = ""
    """Where the memory limit comes from (set on construction)."""
    objective: str = "time"
    """``time`` (step time), ``cost`` (tokens per dollar; needs prices) or ``robust`` (the slow end of each
    plan's 80 % error band, ``cost.bands``: a layout the model has rarely been tested on must win by more)."""
    prices: dict = field(default_factory=dict)
    """Price per GPU-hour by GPU name; missing names fall back to the catalog's price."""
    pins: dict = field(default_factory=dict)
    """Plan fields the user fixed (names in PIN_FIELDS), e.g. ``{"tp": 8, "schedule": "1f1b"}``."""
    top: int = 5
    """Plans kept in the ranked table (the bound prunes against the top-th best)."""
    simulate: bool = True
    """Re-rank the survivors with the event simulator instead of the closed-form pipeline time."""
    front: bool = True
    """Also find the time/memory Pareto front (each member simulated); ``replan`` prices only the top plans."""
    allow_idle_pools: bool = True
    """Mixed clusters: plans may leave whole pools idle."""
    worlds: tuple[int, ...] = ()
    """Homogeneous clusters: smaller world sizes the search may use as well, leaving the other GPUs idle (after
    a node loss the survivors rarely factor into a layout: 16,376 GPUs = 8 x 23 x 89)."""
    exhaustive: bool = False
    """Evaluate every candidate with the full cost model (no bound, no dominance); for tests on small spaces."""
    max_micro_batch: int = 16
    """Largest micro-batch size considered (sequences)."""
    state_copies: int = 0
    """Every plan keeps this many copies of each optimizer-state shard off its node (``Plan.state_copies``),
    priced in memory and per-step traffic."""

    def __post_init__(self) -> None:
        for name in ("global_batch", "seq_len", "top", "max_micro_batch"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise SpecError(f"request.{name}", v, "must be an integer >= 1")
            if v > MAX_COUNT:
                raise SpecError(f"--{name.replace('_', '-')}", v, f"must be at most {MAX_COUNT:,}")
        if not isinstance(self.state_copies, int) or isinstance(self.state_copies, bool) or self.state_copies < 0:
            raise SpecError("--state-copies", self.state_copies, "must be an integer >= 0")
        if self.precision not in PRECISIONS:
            raise SpecError("request.precision", self.precision, f"must be one of {', '.join(PRECISIONS)}")
        if not isinstance(self.framework, FrameworkProfile):
            raise SpecError("request.framework", self.framework, "must be a FrameworkProfile (catalog.framework)")
        if self.max_memory_fraction is None:
            lim = stack_limit(self.framework.name)
            object.__setattr__(self, "max_memory_fraction", lim.fraction)
            object.__setattr__(self, "memory_limit_why", lim.why)
        elif not self.memory_limit_why:
            object.__setattr__(self, "memory_limit_why", "pinned")
        if not isinstance(self.max_memory_fraction, (int, float)) or not 0 < self.max_memory_fraction <= 4:
            raise SpecError("request.max_memory_fraction", self.max_memory_fraction, "must be in (0, 4]")
        if self.objective not in OBJECTIVES:
            raise SpecError("request.objective", self.objective, f"must be one of {', '.join(OBJECTIVES)}")
        if any(not isinstance(w, int) or isinstance(w, bool) or w < 1 for w in self.worlds):
            raise SpecError("request.worlds", self.worlds, "world sizes must be integers >= 1")
        bad = sorted(set(self.pins) - set(PIN_FIELDS))
        if bad:
            raise SpecError("request.pins", bad, f"can pin only {', '.join(PIN_FIELDS)}")
        if self.pins.get("sp") and self.pins.get("tp") == 1:
            raise SpecError("--sp", True, "splits the sequence over the TP group: needs --tp 2 or more (or leave "
                            "tp to the search)")

    def pinned(self, name: str, default=None):
        """The pinned value of ``name`` or ``default``."""
        return self.pins.get(name, default)
