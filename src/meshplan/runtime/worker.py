"""The torchrun worker: read run configs, validate them, start the process group, train, shut down cleanly.

``python -m meshplan.runtime.worker CONFIG.json`` where the file holds one RunConfig or a JSON list of them (tests
run several layouts in one launch to pay the torch start-up once).
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

from meshplan.errors import MeshplanError
from meshplan.runtime.config import RunConfig


def read_configs(path: str) -> list[RunConfig]:
    """One config or a list of them from a JSON file."""
    data = json.loads(Path(path).read_text())
    items = data if isinstance(data, list) else [data]
    return [RunConfig.from_json(json.dumps(d)) for d in items]


def worker_main(cfgs: list[RunConfig]) -> int:
    """Validate every config, then train each under one process group; returns the exit status."""
    import torch.distributed as dist

    from meshplan.runtime.launch import validate
    from meshplan.runtime.mesh import device_for
    from meshplan.runtime.train import run

    world = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        for cfg in cfgs:
            validate(cfg, world)
    except MeshplanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    device = device_for(int(os.environ.get("LOCAL_RANK", "0")))
    backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=min(c.timeout_s for c in cfgs)))
    try:
        for cfg in cfgs:
            run(cfg, device)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from meshplan.runtime.procs import die_with_parent

    die_with_parent()  # a rank never outlives its torchrun (or meshplan)
    sys.exit(worker_main(read_configs(sys.argv[1])))
