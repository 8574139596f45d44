"""Result types of the cost model: time and memory breakdowns and the per-stage durations the pipeline
simulator consumes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Iterable


@dataclass(frozen=True, kw_only=True)
class StageTimes:
    """Durations of one micro-batch on each virtual stage (index ``chunk * pp + rank``), in seconds.

    The pipeline simulator (``meshplan.sim``) and the closed forms (``meshplan.cost.pipeline``) both consume it.
    """

    fwd: tuple[float, ...]
    """Forward time per virtual stage (s), TP/CP/EP communication that is not overlapped included."""
    bwd_input: tuple[float, ...]
    """Backward input-gradient time per virtual stage (s), recompute included."""
    bwd_weight: tuple[float, ...]
    """Backward weight-gradient time per virtual stage (s)."""
    p2p: tuple[float, ...]
    """Activation send time from virtual stage i to i+1 (s); the last entry is unused (0)."""
    act_bytes: tuple[float, ...]
    """Activation memory one in-flight micro-batch holds on each virtual stage (bytes)."""
    dp_tail: tuple[float, ...] = ()
    """Per pipeline rank: data-parallel gradient traffic that can only start after the rank's last backward
    (s). Empty = none."""

    @property
    def n_stages(self) -> int:
        """Number of virtual stages."""
        return len(self.fwd)


INSIDE_COMPUTE = ("recompute", "host_wait")
"""TimeBreakdown fields that say what part of ``compute`` went where (not added to the step)."""


@dataclass(frozen=True, kw_only=True)
class TimeBreakdown:
    """Where one optimizer step's time goes on the critical path (s). Sums to the step time."""

    compute: float = 0.0
    """Forward + backward compute of the busiest pipeline rank, recompute included."""
    recompute: float = 0.0
    """Part of compute spent recomputing activations (informative; already inside compute)."""
    host_wait: float = 0.0
    """Part of compute the device idles while the host issues ops (informative; already inside compute)."""
    bubble: float = 0.0
    """Pipeline fill/drain idle time."""
    tp_comm: float = 0.0
    """Exposed tensor/sequence-parallel collectives."""
    cp_comm: float = 0.0
    """Exposed context-parallel KV exchange, and a ring's merges of partial results outside the attention kernel."""
    ep_comm: float = 0.0
    """Exposed expert-parallel all-to-all."""
    pp_comm: float = 0.0
    """Exposed pipeline sends/receives."""
    dp_comm: float = 0.0
    """Exposed data-parallel / ZeRO / FSDP traffic."""
    optimizer: float = 0.0
    """Optimizer step (memory-bound)."""
    overhead: float = 0.0
    """Fixed per-step framework overhead (launch, data loading, logging)."""

    def total(self) -> float:
        """Step time: every component except ``recompute`` and ``host_wait`` (already part of compute)."""
        return sum(getattr(self, f.name) for f in fields(self) if f.name not in INSIDE_COMPUTE)

    def as_dict(self) -> dict:
        """Plain dict (s)."""
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class MemoryBreakdown:
    """Peak memory of one rank, by component (bytes)."""

    params: float = 0.0
    """Model weights held by the rank (working precision, plus master copy where not sharded away)."""
    grads: float = 0.0
    """Gradient buffers."""
    optimizer: float = 0.0
    """Optimizer states (fp32 master weights, Adam moments) after ZeRO sharding."""
    activations: float = 0.0
    """Activations saved for backward at the schedule's peak of in-flight micro-batches."""
    buffers: float = 0.0
    """Communication buckets, all-gathered FSDP units, logits and other temporaries."""
    reserved: float = 0.0
    """CUDA context and allocator fragmentation."""

    def total(self) -> float:
        """Peak bytes."""
        return sum(getattr(self, f.name) for f in fields(self))

    def as_dict(self) -> dict:
        """Plain dict (bytes)."""
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class Estimate:
    """Prediction for one (model, cluster, plan)."""

    step_time: float
    """Seconds per optimizer step."""
    tokens_per_s: float
    """Training tokens per second over the whole cluster."""
    mfu: float
    """Model FLOPs utilization (model FLOPs without recompute / step time / peak of all GPUs)."""
    model_flops: float
    """Model FLOPs per step (6N-style, attention included, no recompute)."""
    time: TimeBreakdown
    """Critical-path breakdown."""
    memory: MemoryBreakdown
    """The rank with the highest peak."""
    memory_per_stage: tuple[MemoryBreakdown, ...]
    """Peak per pipeline rank."""
    capacity: float
    """Device memory of the tightest GPU (bytes)."""
    stage_times: StageTimes
    """Per-stage durations used for the pipeline."""
    bubble_fraction: float = 0.0
    """Idle share of the busiest rank's step."""
    pipeline_source: str = "closed-form"
    """``closed-form`` or ``simulator``."""

    @property
    def peak_memory(self) -> float:
        """Peak bytes on the worst rank."""
        return self.memory.total()

    @property
    def fits(self) -> bool:
        """Peak memory is within device capacity."""
        return self.peak_memory <= self.capacity

    def as_dict(self) -> dict:
        """JSON-friendly summary."""
        return {"step_time_s": self.step_time, "tokens_per_s": self.tokens_per_s, "mfu": self.mfu,
                "model_flops": self.model_flops, "time_s": self.time.as_dict(),
                "memory_bytes": self.memory.as_dict(), "peak_memory_bytes": self.peak_memory,
                "capacity_bytes": self.capacity, "fits": self.fits, "bubble_fraction": self.bubble_fraction,
                "memory_per_stage_bytes": [m.total() for m in self.memory_per_stage],
                "pipeline_source": self.pipeline_source}


def pareto_front(points: Iterable[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both coordinates (both minimized), sorted by the first.

    A point is dominated when another is <= on both and < on one; exact duplicates keep the first index.

    Example: ``pareto_front([(1, 5), (2, 3), (3, 4), (2, 3)]) == [0, 1]``: (3, 4) loses to (2, 3) on both,
    and the second (2, 3) duplicates the first.
    """
    pts = list(points)
    order = sorted(range(len(pts)), key=lambda i: (pts[i][0], pts[i][1], i))
    front, best_y = [], float("inf")
    for i in order:
        if pts[i][1] < best_y:
            front.append(i)
            best_y = pts[i][1]
    return front
