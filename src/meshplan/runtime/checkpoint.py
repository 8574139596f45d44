"""Distributed checkpoints with torch.distributed.checkpoint (DCP), saved atomically and loadable under any plan.

State dicts are keyed by global parameter names (the model parts keep them) and the optimizer state is flattened
by parameter name, so a checkpoint written by one layout (degrees, world size, pipeline split) loads into another:
DCP reshards DTensors on load. A checkpoint is written to ``step-N.tmp`` and renamed to ``step-N`` by rank 0 only
after every rank finished, with a ``meta.json`` inside; a half-written folder is never picked up.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

_DIR = re.compile(r"^step-(\d+)$")
_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def _state(t) -> dict:
    model, optim = {}, {}
    for part, opt in zip(t.parts, t.optimizers):
        model.update(get_model_state_dict(part))
        optim.update(get_optimizer_state_dict(part, opt, options=_OPTIONS))
    return {"model": model, "optim": optim}


def latest(root: str) -> tuple[int, Path] | None:
    """The newest complete checkpoint (step, folder) under root, or None."""
    best = None
    base = Path(root)
    if not base.is_dir():
        return None
    for d in base.iterdir():
        m = _DIR.match(d.name)
        if m and (d / "meta.json").is_file() and (best is None or int(m.group(1)) > best[0]):
            best = (int(m.group(1)), d)
    return best


def save(t, step: int) -> Path:
    """Write the checkpoint of ``step`` atomically; returns its folder."""
    root = Path(t.cfg.checkpoint_dir)
    tmp, final = root / f"step-{step:08d}.tmp", root / f"step-{step:08d}"
    if dist.get_rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    dcp.save(_state(t), checkpoint_id=str(tmp))
    dist.barrier()
    if dist.get_rank() == 0:
        (tmp / "meta.json").write_text(json.dumps({"step": step, "plan": t.cfg.plan.to_dict(),
                                                   "model": t.cfg.model, "world_size": dist.get_world_size()}))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
    dist.barrier()
    return final


def load(t, folder: Path) -> int:
    """Load a checkpoint folder into this rank's parts and optimizers (any source plan); returns its step."""
    state = _state(t)
    dcp.load(state, checkpoint_id=str(folder))
    for part, opt in zip(t.parts, t.optimizers):
        set_model_state_dict(part, state["model"], options=StateDictOptions(strict=False))
        set_optimizer_state_dict(part, opt, state["optim"], options=_OPTIONS)
    return json.loads((folder / "meta.json").read_text())["step"]


def maybe_resume(t) -> int:
    """Resume from the newest complete checkpoint in checkpoint_dir; returns its step, or 0 when there is none."""
    found = latest(t.cfg.checkpoint_dir) if t.cfg.checkpoint_dir else None
    if found is None:
        return 0
    return load(t, found[1])
