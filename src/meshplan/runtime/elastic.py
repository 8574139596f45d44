"""Surviving a lost rank: when a run dies because ranks were killed, re-plan for the survivors and resume from
the last complete checkpoint, up to a number of restarts.

torchrun's own elastic agent restarts every worker of the same world (torch 2.13
``distributed/elastic/agent/server/api.py::_invoke_run``), which cannot help when a GPU is gone. Here the
supervisor counts the ranks that died by a signal (torchrun's failure report), takes them as lost, searches the
best layout the runtime can run on the rest (``search`` with the ``meshplan`` stack, smaller worlds allowed, as
``meshplan replan`` does) and relaunches on it with ``resume``: DCP loads the checkpoint under any layout, so at
most the steps since it are lost.
"""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import replace

from meshplan import catalog
from meshplan.errors import PlanError
from meshplan.runtime.config import RunConfig

KILLED = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*-(?:9|6|11|7)\b")
"""A rank of torchrun's failure report that died by SIGKILL, SIGABRT, SIGSEGV or SIGBUS (its peers end by
SIGTERM, which is torchrun's teardown, not a loss)."""


def killed_ranks(stderr: str) -> list[int]:
    """Ranks torchrun reports as killed by a signal other than its own SIGTERM."""
    return sorted({int(m.group(1)) for m in KILLED.finditer(stderr)})


def survivor_plan(cfg: RunConfig, world: int):
    """The fastest plan the runtime runs on at most ``world`` ranks for this run's model and workload. The
    search knows the stack's layouts but not every limit of torch.distributed.pipelining (fewer micro-batches than
    stages), so a winner the runtime refuses is searched again with one micro-sequence per micro-batch, then
    without a pipeline."""
    from meshplan.runtime.launch import plan_problems
    from meshplan.search import SearchRequest, search

    spec = catalog.model(cfg.model)
    cluster = catalog.cluster(f"{world}xcpu")
    p = cfg.plan
    reasons = []
    for pins in ({}, {"micro_batch": 1}, {"pp": 1}):
        request = SearchRequest(global_batch=p.global_batch, seq_len=p.seq_len, precision=p.precision,
                                framework=cfg.stack, worlds=tuple(range(world - 1, 0, -1)), top=8, simulate=False,
                                pins=pins)
        result = search(spec, cluster, request)
        for rp in result.plans:
            bad = plan_problems(spec, cfg, rp.plan, rp.plan.n_gpus)
            if not bad:
                return rp.plan
            reasons += bad
        if result.infeasible is not None:
            reasons.append(result.infeasible.reason)
    raise PlanError([f"no layout for the {world} surviving ranks: " + "; ".join(dict.fromkeys(reasons))])


def run_elastic(cfg: RunConfig, *, nproc: int, restarts: int, timeout_s: float | None, start) -> int:
    """Start the run; after a failure with killed ranks, re-plan for the survivors and resume, at most
    ``restarts`` times. ``start(cfg, nproc)`` launches once and returns (returncode, stderr)."""
    attempt, world = 0, nproc
    while True:
        began = time.monotonic()
        rc, err = start(cfg, world)
        failed_after = time.monotonic() - began
        lost = killed_ranks(err or "")
        if rc == 0 or attempt >= restarts or not lost or not cfg.checkpoint_dir:
            if err and rc:
                sys.stderr.write(err[-4000:])
            return rc
        attempt += 1
        world -= len(lost)
        if world < 1:
            return rc
        plan = survivor_plan(cfg, world)
        from meshplan.runtime.checkpoint import latest

        found = latest(cfg.checkpoint_dir)
        print(json.dumps({"restart": attempt, "lost_ranks": lost, "survivors": world, "plan": plan.to_dict(),
                          "gpus_used": plan.n_gpus, "resume_from_step": found[0] if found else 0,
                          "failed_attempt_s": round(failed_after, 3)}), flush=True)
        cfg = replace(cfg, plan=plan, resume=True, fail_at_step=0, switches=(), pools=())
        world = plan.n_gpus
