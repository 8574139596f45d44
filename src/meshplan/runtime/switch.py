"""Switch a running trainer to another layout in the same process group: build B beside A, move parameters and
AdamW state with ``runtime.reshard``, hand back B's trainer. Also the storage route (DCP save, load under B), the
oracle a live switch must equal bit for bit."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from meshplan.runtime.build import Trainer, build_trainer
from meshplan.runtime.mesh import build_meshes
from meshplan.runtime.reshard import Side, box_of, execute, plan_moves
from meshplan.spec.plan import Plan

MOMENTS = ("exp_avg", "exp_avg_sq")
"""AdamW's per-parameter state tensors (torch.optim.AdamW); ``step`` is one count shared by all."""


@dataclass(frozen=True, kw_only=True)
class SwitchReport:
    """What one switch did on this rank."""

    seconds: float
    """Wall time of the move (after B is built; both layouts' groups exist)."""
    build_s: float
    """Building B's meshes, modules and optimizer beside A."""
    bytes_in: int
    """Bytes this rank received from other ranks."""
    messages: int
    """Regions this rank received from other ranks."""


def _params(t: Trainer) -> dict[str, tuple[torch.nn.Parameter, torch.optim.Optimizer]]:
    out = {}
    for part, opt in zip(t.parts, t.optimizers):
        for name, p in part.named_parameters():
            out[name] = (p, opt)
    return out


def _local(x: torch.Tensor) -> torch.Tensor:
    return x.to_local() if hasattr(x, "to_local") else x


def _side(t: Trainer, *, create: bool) -> tuple[Side, float | None]:
    """This rank's persistent tensors keyed ``fqn`` and ``fqn#moment``; ``create``: give a fresh optimizer its
    state (zeros shaped like the parameters) to receive into. Returns the side and AdamW's step count."""
    tensors, step = {}, None
    for name, (p, opt) in _params(t).items():
        shape, box = box_of(p)
        tensors[name] = (_local(p), box)
        state = opt.state[p]
        if create:
            state.update({m: torch.zeros_like(p) for m in MOMENTS})
        elif not state:
            continue
        else:
            step = float(state["step"])
        for m in MOMENTS:
            tensors[f"{name}#{m}"] = (_local(state[m]), box)
    return Side(tensors=tensors), step


def _held(side: Side) -> dict:
    return {k: box for k, (_, box) in side.tensors.items()}


def switch_trainer(t: Trainer, plan_b: Plan, *, budget: int = 256 * 2**20) -> tuple[Trainer, SwitchReport]:
    """Build layout B in this world and move A's state into it; returns B's trainer. A is left intact until the
    move is complete, so a failure before the return leaves A training."""
    began = time.perf_counter()
    cfg_b = replace(t.cfg, plan=plan_b)
    t_b = build_trainer(cfg_b, t.spec, build_meshes(plan_b, t.device.type), t.device)
    built = time.perf_counter() - began
    src, step = _side(t, create=False)
    steps = _steps(step)
    dst, _ = _side(t_b, create=True)
    if not steps:  # A has not stepped yet: only the parameters exist
        dst = Side(tensors={k: v for k, v in dst.tensors.items() if "#" not in k})
    rank = dist.get_rank()
    metas: list = [None] * dist.get_world_size()
    dist.all_gather_object(metas, (_held(src), _held(dst)))
    moves = plan_moves([m[0] for m in metas], [m[1] for m in metas])
    itemsize = {k: v[0].element_size() for k, v in {**src.tensors, **dst.tensors}.items()}
    itemsize.update({m.key: 4 for m in moves if m.key not in itemsize})
    dist.barrier()
    start = time.perf_counter()
    with torch.no_grad():
        got = execute(moves, rank=rank, src=src, dst=dst, itemsize=itemsize, budget=budget)
    _set_step(t_b, steps)
    dist.barrier()
    seconds = time.perf_counter() - start
    n_in = sum(1 for m in moves if m.dst == rank and m.src != rank)
    return t_b, SwitchReport(seconds=seconds, build_s=built, bytes_in=got, messages=n_in)


def _steps(step: float | None) -> set:
    """AdamW step counts over the world (a rank idle under A, or whose A state is empty, has none)."""
    steps: list = [None] * dist.get_world_size()
    dist.all_gather_object(steps, step)
    return {s for s in steps if s is not None}


def _set_step(t: Trainer, steps: set) -> None:
    if not steps:
        return
    if len(steps) > 1:
        raise RuntimeError(f"ranks disagree on AdamW's step count: {sorted(steps)}")
    value = steps.pop()
    for p, opt in _params(t).values():
        st = opt.state[p]
        if st:
            st["step"] = torch.tensor(value, dtype=torch.float32)


def switch_via_checkpoint(t: Trainer, plan_b: Plan, folder: str) -> Trainer:
    """The storage route (DCP save of A, then a fresh B loads it): the oracle of a live switch."""
    from meshplan.runtime import checkpoint

    cfg = replace(t.cfg, checkpoint_dir=folder)
    saved = checkpoint.save(replace(t, cfg=cfg), 0)
    t_b = build_trainer(replace(t.cfg, plan=plan_b), t.spec, build_meshes(plan_b, t.device.type), t.device)
    checkpoint.load(t_b, saved)
    return t_b


def predict(spec, plan_a: Plan, plan_b: Plan, stack, *, world: int | None = None) -> dict:
    """The transition model's figures for this switch on this host's ``world`` ranks (identity rank map: each
    layout's mesh is built in the default order over the first n_gpus ranks): predicted seconds and bytes."""
    import numpy as np

    from meshplan import catalog
    from meshplan.cost.calib import gpu_calibration
    from meshplan.cost.state_layout import geometry, state_groups
    from meshplan.cost.transition import Placement, transfer_bytes
    from meshplan.cost.transition_time import SwitchCosts, new_groups, switch_time

    pool = catalog.cluster(f"{world or max(plan_a.n_gpus, plan_b.n_gpus)}xcpu").pools[0]
    ga, gb = geometry(spec, plan_a, stack), geometry(spec, plan_b, stack)
    ids_a, ids_b = np.arange(plan_a.n_gpus), np.arange(plan_b.n_gpus)
    x = transfer_bytes(Placement(ga, ids_a), Placement(gb, ids_b), tensors=state_groups(spec),
                       lost_gpus=np.array([], dtype=np.int64), domain=pool.network()[0].span)
    t = switch_time(x, phys_b=ids_b, pool=pool, calib=gpu_calibration(pool.gpu),
                    costs=SwitchCosts(groups_prebuilt=True), new_groups=new_groups(plan_b))
    return {"predicted_s": t.total_s, "predicted_bytes": x.moved,
            "predicted_bytes_max": float((x.in_local + x.in_fabric).max())}


def run_switch(t: Trainer, step: int, plan_b: Plan, opts: dict) -> tuple[Trainer, dict]:
    """One switch as the training loop asks for it; returns the trainer to go on with and the log row (rank 0's
    view, maxima and sums over ranks). A plan that needs state no rank holds is refused before anything moves,
    and training goes on under A."""
    from meshplan.errors import PlanError

    row = {"switch": step, "from": t.cfg.plan.to_dict(), "to": plan_b.to_dict(),
           **predict(t.spec, t.cfg.plan, plan_b, t.cfg.stack, world=dist.get_world_size())}
    try:
        if opts.get("dry_run"):
            return t, {**row, "dry_run": True, **_dry(t, plan_b)}
        t_b, rep = switch_trainer(t, plan_b)
    except PlanError as exc:
        return t, {**row, "error": str(exc), "kept": row["from"]}
    reports: list = [None] * dist.get_world_size()
    dist.all_gather_object(reports, rep)
    row.update(seconds=max(r.seconds for r in reports), build_s=max(r.build_s for r in reports),
               bytes=sum(r.bytes_in for r in reports), bytes_max=max(r.bytes_in for r in reports),
               messages_max=max(r.messages for r in reports))
    if opts.get("check"):
        row["bit_equal"] = _equal_to_checkpoint_route(t, t_b, plan_b, step)
    return t_b, row


def _dry(t: Trainer, plan_b: Plan) -> dict:
    """Plan the move (B's groups built, metadata exchanged) without moving a byte."""
    t_b = build_trainer(replace(t.cfg, plan=plan_b), t.spec, build_meshes(plan_b, t.device.type), t.device)
    src, step = _side(t, create=False)
    dst, _ = _side(t_b, create=bool(_steps(step)))
    metas: list = [None] * dist.get_world_size()
    dist.all_gather_object(metas, (_held(src), _held(dst)))
    moves = plan_moves([m[0] for m in metas], [m[1] for m in metas])
    size = {k: v[0].element_size() for k, v in dst.tensors.items()}
    return {"planned_bytes": sum(m.numel * size.get(m.key, 4) for m in moves if m.src != m.dst),
            "planned_messages": sum(1 for m in moves if m.src != m.dst)}


def _equal_to_checkpoint_route(t_a: Trainer, t_b: Trainer, plan_b: Plan, step: int) -> bool:
    """Load B from a DCP checkpoint of A and compare every local parameter and moment bit for bit."""
    import tempfile

    folder = None
    if dist.get_rank() == 0:
        folder = tempfile.mkdtemp(prefix="meshplan-switch-check-")
    box = [folder]
    dist.broadcast_object_list(box, src=0)
    ref = switch_via_checkpoint(t_a, plan_b, box[0])
    mine, theirs = _side(t_b, create=False)[0].tensors, _side(ref, create=False)[0].tensors
    same = mine.keys() == theirs.keys() and all(torch.equal(mine[k][0], theirs[k][0]) for k in mine)
    flags: list = [None] * dist.get_world_size()
    dist.all_gather_object(flags, same)
    if dist.get_rank() == 0:
        import shutil

        shutil.rmtree(box[0], ignore_errors=True)
    return all(flags)
