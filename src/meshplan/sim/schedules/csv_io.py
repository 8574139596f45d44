"""Custom schedules as the CSV that torch.distributed.pipelining (``_PipelineScheduleRuntime._load_csv``,
"compute_only" format) and torchtitan (``pipeline_parallel_schedule_csv``) read: one row per rank, one action
per cell such as ``0F0``, ``3I7``, ``3W7``, ``2B1``; empty cells are idle steps. So one file runs in both places.

Reading also accepts torch's lowered cells: ``(0F3;5B2)OVERLAP_F_B`` becomes its sub-actions in order, and
SEND_*/RECV_*/UNSHARD/RESHARD/REDUCE_GRAD cells are skipped (the simulator derives transfers from the
placement; gradient traffic comes from ``StageTimes.dp_tail``). Writing emits compute actions only.
"""

from __future__ import annotations

import csv
from pathlib import Path

from meshplan.sim.actions import COMPUTE_KINDS, Action, parse_token
from meshplan.sim.schedule import Schedule, ScheduleError
from meshplan.sim.validate import validate

_OVERLAP = "OVERLAP_F_B"


def _cell_actions(cell: str) -> list[Action]:
    """Compute actions of one cell (several for an OVERLAP_F_B cell); raises ValueError on a bad token."""
    text = cell.strip()
    if text.startswith("(") and text.endswith(")" + _OVERLAP):
        parts = text[1:-len(_OVERLAP) - 1].split(";")
        return [a for p in parts for a in _cell_actions(p)]
    parsed = parse_token(text)
    if parsed is None or parsed[0] not in COMPUTE_KINDS:
        return []
    kind, stage, mb = parsed
    if mb is None:
        raise ValueError(f"{text!r} has no micro-batch index (e.g. {stage}{kind}0)")
    return [Action(kind, stage, mb)]


def _read_rows(path: str) -> tuple[list[list[Action]], list[list[int]]]:
    """Per rank: compute actions, and the file column (step) each came from."""
    rows, cols = [], []
    try:
        with open(path, newline="") as fh:
            lines = list(csv.reader(fh))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ScheduleError(f"is not a text CSV of actions ({exc})", source=path) from None
    for rank, cells in enumerate(lines):
        acts, where = [], []
        for step, cell in enumerate(cells):
            try:
                found = _cell_actions(cell)
            except ValueError as exc:
                raise ScheduleError(f"bad action token: {exc}", rank=rank, step=step, action=cell.strip(),
                                    source=path) from None
            acts += found
            where += [step] * len(found)
        rows.append(acts)
        cols.append(where)
    return rows, cols


def _placement(rows: list[list[Action]], cols: list[list[int]], path: str) -> tuple[int, ...]:
    """Rank of each stage, inferred from where its actions sit (torch does the same)."""
    owner: dict[int, int] = {}
    for rank, acts in enumerate(rows):
        for k, a in enumerate(acts):
            if owner.setdefault(a.stage, rank) != rank:
                raise ScheduleError(f"stage {a.stage} is already on rank {owner[a.stage]}; a stage lives on one rank",
                                    rank=rank, step=cols[rank][k], action=str(a), source=path)
    n_stages = max(owner, default=-1) + 1
    lost = [s for s in range(n_stages) if s not in owner]
    if lost:
        raise ScheduleError(f"stage {lost[0]} appears on no rank (stages 0..{n_stages - 1} are used)", source=path)
    return tuple(owner[s] for s in range(n_stages))


def load_schedule_csv(path: str | Path) -> Schedule:
    """Read and validate a custom schedule.

    Raises:
        ScheduleError: bad token, stage on two ranks, missing or duplicate action, or deadlock; the message
            names the rank, the step (the 0-based column in the file) and the action.
    """
    src = str(path)
    rows, cols = _read_rows(src)
    if not rows or not any(rows):
        raise ScheduleError("has no actions", source=src)
    placement = _placement(rows, cols, src)
    n_micro = max(a.microbatch for acts in rows for a in acts) + 1
    actions = sum(len(acts) for acts in rows)
    if n_micro * len(placement) > actions:  # every micro-batch passes every stage: checked before any table is built
        raise ScheduleError(f"names micro-batch {n_micro - 1} but holds only {actions} actions for "
                            f"{len(placement)} stages: micro-batches must be numbered 0, 1, ... without gaps",
                            source=src)
    sched = Schedule(name=src, pp=len(rows), n_stages=len(placement), n_micro=n_micro, placement=placement,
                     actions=tuple(tuple(acts) for acts in rows))
    try:
        validate(sched)
    except ScheduleError as exc:
        if exc.rank is None or exc.step is None:
            raise
        raise ScheduleError(exc.reason, rank=exc.rank, step=cols[exc.rank][exc.step], action=exc.action,
                            source=src) from None
    return sched


def write_schedule_csv(schedule: Schedule, path: str | Path) -> None:
    """Write the compute actions, one row per rank, in torch's compute_only CSV layout."""
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        for row in schedule.actions:
            writer.writerow([str(a) for a in row])
