"""A pipeline schedule as per-rank action lists, its stage placements, and the error a bad schedule raises."""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.errors import MeshplanError
from meshplan.sim.actions import Action


class ScheduleError(MeshplanError):
    """A schedule (generated or read from a file) is invalid; names the rank, step and action at fault."""

    def __init__(self, reason: str, *, rank: int | None = None, step: int | None = None,
                 action: str | None = None, source: str = ""):
        self.reason = reason
        self.rank = rank
        self.step = step
        self.action = action
        self.source = source
        where = ", ".join(p for p in (f"rank {rank}" if rank is not None else "",
                                      f"step {step}" if step is not None else "",
                                      f"action {action}" if action is not None else "") if p)
        head = f"schedule {source}: " if source else "schedule: "
        super().__init__(head + (f"{where}: " if where else "") + reason)


def loop_placement(*, pp: int, n_stages: int) -> tuple[int, ...]:
    """Rank of each stage for looped schedules: stage ``chunk * pp + rank`` (Megatron, torch ``style="loop"``)."""
    return tuple(s % pp for s in range(n_stages))


def v_placement(*, pp: int, n_stages: int) -> tuple[int, ...]:
    """Rank of each stage for V-shaped schedules (ZB-V, DualPipeV): rank r holds stages r and 2pp-1-r, so the
    first and last stage share rank 0 (Qi et al. 2024 sec. 3; torch ``style="v"``)."""
    out = []
    for s in range(n_stages):
        chunk, pos = divmod(s, pp)
        out.append(pos if chunk % 2 == 0 else pp - 1 - pos)
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """Per-rank ordered compute actions. Sends and receives are implied: the output of F(s, mb) goes to the
    rank of stage s+1, the input gradient of I/B(s, mb) to the rank of stage s-1, whenever that rank differs."""

    name: str
    """Registry name (``1f1b``, ...) or the file the schedule was read from."""
    pp: int
    """Pipeline ranks."""
    n_stages: int
    """Virtual stages in pipeline order (pp * chunks per rank)."""
    n_micro: int
    """Micro-batches per step."""
    placement: tuple[int, ...]
    """Rank of each stage (index = stage in pipeline order)."""
    actions: tuple[tuple[Action, ...], ...]
    """Per rank, the compute actions in execution order."""

    def __post_init__(self) -> None:
        if len(self.actions) != self.pp:
            raise ScheduleError(f"has {len(self.actions)} rank rows, needs pp={self.pp}", source=self.name)
        if len(self.placement) != self.n_stages:
            raise ScheduleError(f"placement has {len(self.placement)} entries, needs {self.n_stages} stages",
                                source=self.name)

    @property
    def vpp(self) -> int:
        """Stages (model chunks) per rank."""
        return self.n_stages // self.pp

    def chunk(self, stage: int) -> int:
        """Local chunk index of ``stage`` on its rank (0 = the rank's earliest stage in pipeline order)."""
        rank = self.placement[stage]
        return sum(1 for s in range(stage) if self.placement[s] == rank)

    def stages_of(self, rank: int) -> tuple[int, ...]:
        """Stages held by ``rank``, in pipeline order."""
        return tuple(s for s, r in enumerate(self.placement) if r == rank)

    @property
    def n_actions(self) -> int:
        """Compute actions over all ranks."""
        return sum(len(a) for a in self.actions)
