"""The timing worker of ``meshplan check --serve``: ``python -m meshplan.runtime.serve_check CONFIGS.json
OUT.json`` under torchrun. Every rank builds the reference decoder for each configuration (tensor-parallel over
``tp`` ranks, ``world / tp`` replicas), serves a closed loop of fixed-length requests with continuous batching
(``runtime.decode``), after one warm-up round of the same loop, and rank 0 writes each request's tokens, TTFT and
TPOT. Requests are numbered across replicas (replica r serves those with index = r mod replicas) and every
prompt comes from its own seeded generator, so any layout serves the same requests.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from meshplan.calibrate.serve_agreement import ServeCase


def _serve_case(case: ServeCase, world: int) -> list[dict]:
    """This rank's replica serves its share of the case; returns one row per request it served."""
    import torch
    import torch.distributed as dist

    from meshplan import catalog
    from meshplan.runtime.decode import Engine, Request, closed_loop, install_cache, prompts
    from meshplan.runtime.mesh import build_meshes
    from meshplan.runtime.models.decoder import build_decoder
    from meshplan.runtime.parallelize import apply_tp
    from meshplan.spec.plan import Plan

    spec = catalog.model(case.model)
    replicas = world // case.tp
    total = case.input_len + case.output_len
    meshes = build_meshes(Plan(global_batch=replicas, seq_len=total, tp=case.tp, dp=replicas), "cpu")
    model = build_decoder(spec, seed=case.seed, max_seq_len=total)
    if case.tp > 1:
        apply_tp(model, meshes)
    model.eval()
    mine = case.clients // replicas
    rank = meshes.rank_in("dp")
    texts = prompts(spec.vocab, case.requests, case.input_len, seed=case.seed)
    for warm in (True, False):
        state = install_cache(model, n_slots=mine, max_len=total)
        engine = Engine(model, state, mine, torch.device("cpu"))
        reqs = [Request(index=i, prompt=texts[i], output_len=case.output_len)
                for i in range(rank, case.requests, replicas)]
        dist.barrier()
        closed_loop(engine, reqs[:mine] if warm else reqs, mine)
    wave = set(i for i in range(rank, case.requests, replicas)[:mine])
    rows = [{"index": r.index, "tokens": r.tokens, "ttft_s": r.times[0] - r.arrival, "e2e_s": r.times[-1] - r.arrival,
             "tpot_s": (r.times[-1] - r.times[0]) / max(len(r.times) - 1, 1), "start_wave": r.index in wave,
             "first_s": r.arrival, "last_s": r.times[-1]} for r in reqs]
    return rows if meshes.rank_in("tp") == 0 else []


def main(argv: list[str]) -> int:
    """``serve_check CONFIGS.json OUT.json``: serve every case; rank 0 writes the requests of each."""
    from datetime import timedelta

    import torch.distributed as dist

    cases = [ServeCase(**c) for c in json.loads(Path(argv[0]).read_text())]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    out = []
    try:
        for i, case in enumerate(cases):
            rows = _serve_case(case, world)
            gathered: list = [None] * world
            dist.all_gather_object(gathered, rows)
            out.append({"case": case.to_dict(), "requests": sorted((r for g in gathered for r in g),
                                                                   key=lambda r: r["index"])})
            if dist.get_rank() == 0:
                print(f"[check --serve] {i + 1}/{len(cases)} {case.label()}", file=sys.stderr, flush=True)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if int(os.environ.get("RANK", "0")) == 0:
        Path(argv[1]).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    from meshplan.runtime.procs import die_with_parent

    die_with_parent()  # a rank never outlives its torchrun (or meshplan)
    sys.exit(main(sys.argv[1:]))
