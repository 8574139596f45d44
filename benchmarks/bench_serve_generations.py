#!/usr/bin/env python
"""Leave-one-generation-out for the serving constants: for each GPU generation of the serving measurements, refit
the constants without its rows and predict them two ways, as a GPU no visible row uses would be predicted:
``median``, the serving kernels' constants as the fitted generations' median (``serve_step.per_generation``,
what meshplan does), and ``training``, the training calibration of that generation (what it did before: a decode
step's HBM efficiency, prefill attention and GEMM shares from the training fit, no all-reduce barrier). Prints
MAPE per metric for each; takes a few minutes (one fit per generation).

Usage: python benchmarks/bench_serve_generations.py [inference.csv]"""

import csv
import statistics
import sys
from pathlib import Path

from meshplan import catalog
from meshplan.calibrate.serve_fit import fit_rows
from meshplan.calibrate.serve_validate import predict_row
from meshplan.cost.calib import gpu_calibration
from meshplan.errors import MeshplanError

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT.parent / "shared" / "validation" / "inference_visible.csv"
TABLES = ("decode_mem_eff", "decode_kv_eff", "prefill_attn_eff", "engine_gemm_eff", "allreduce_s")


def generation(row: dict) -> str | None:
    try:
        return catalog.gpu(row["gpu_key"].strip()).generation
    except MeshplanError:
        return None


def training_constants(consts: dict, rows: list[dict]) -> dict:
    """``consts`` with the held-out generation's kernel constants pinned to its training calibration."""
    calib = gpu_calibration(catalog.gpu(rows[0]["gpu_key"].strip()))
    gen = generation(rows[0])
    own = {"decode_mem_eff": calib.mem_eff, "decode_kv_eff": calib.mem_eff, "prefill_attn_eff": calib.attn_eff,
           "engine_gemm_eff": calib.gemm_eff, "allreduce_s": 0.0}
    return {**consts, **{t: {**consts.get(t, {}), gen: own[t]} for t in TABLES}}


def errors(rows: list[dict], consts: dict) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for row in rows:
        try:
            got, _ = predict_row(row, consts)
        except MeshplanError:
            continue
        if got is not None:
            key = got.metric + (" (queue-dominated)" if got.metric == "ttft_ms" and got.queue_dominated else "")
            out.setdefault(key, []).append(abs(got.error_pct))
    return out


def main() -> int:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    gens = sorted({g for g in map(generation, rows) if g})
    print(f"leave-one-generation-out on {path.name}: MAPE % (rows), median of the fitted generations vs training")
    for gen in gens:
        mine = [r for r in rows if generation(r) == gen]
        consts = fit_rows([r for r in rows if generation(r) != gen])
        median, training = errors(mine, consts), errors(mine, training_constants(consts, mine))
        for key in sorted(median):
            m, t = median[key], training.get(key, [])
            print(f"  {gen:10s} {key:28s} {len(m):4d}  median {statistics.fmean(m):6.1f}  "
                  f"training {statistics.fmean(t) if t else float('nan'):6.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
