"""Fitting the serving constants (``serve_constants.TABLES``) to a serving CSV by coordinate descent over a grid:
each constant in turn takes the grid value that minimises the mean absolute log error, averaged over the metric
groups it touches (decode-time metrics, throughput, TTFT outside queueing), so no group outweighs another by its
row count. Run by ``scripts/fit_serving.py``."""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path

from meshplan import catalog
from meshplan.calibrate.serve_validate import named, predict_row, row_engine
from meshplan.errors import MeshplanError

GRIDS = {"decode_mem_eff": [0.5 + 0.05 * i for i in range(10)],
         "decode_kv_eff": [0.5 + 0.05 * i for i in range(10)],
         "prefill_attn_eff": [0.3 + 0.05 * i for i in range(10)],
         "engine_gemm_eff": [0.5 + 0.05 * i for i in range(8)],
         "step_host_s": [0.0005 * i for i in range(11)],
         "seq_host_s": [0.0, 5e-6, 1e-5, 2e-5, 3e-5, 4e-5, 5e-5, 6e-5, 8e-5, 1e-4],
         "allreduce_s": [2.5e-6 * i for i in range(17)]}
"""Searched values: HBM efficiency 0.50-0.95 (weight reads; KV-cache reads); prefill attention 0.30-0.75 of the
16-bit peak (the physical range of forward kernels: FlashAttention-2 forward reaches 50-73 % on A100, Dao 2023;
FlashAttention-3 up to 75 % on H100, Shah et al. 2024); an engine's GEMMs 0.50-0.85 of the dtype's dense peak
(cuBLASLt/CUTLASS at inference shapes); host time per step 0-5 ms, and per running sequence per step 0-100 us
(a Python loop's few microseconds to a pickled hand-off's tens); per TP all-reduce beyond its link's alpha-beta
time 0-40 us (the custom kernels' cross-rank flag barrier waits for the slowest rank; by GPU generation, since the
engines' one-shot kernels share it; Ada's value is its PCIe servers', which reach the top of the range).
``request_s`` (time outside the engine) is not fitted: the single-client TTFT rows, where it would show, are met
within 5 % without it, and the rows that would pull it up are those whose queueing the model under-predicts (high
concurrency), which it must not hide."""
GROUPS = {"ttft_ms": "ttft", "itl_ms": "token", "tpot_ms": "token", "e2e_latency_s": "token",
          "output_tokens_per_s": "throughput", "requests_per_s": "throughput", "total_tokens_per_s": "throughput",
          "tokens_per_s_per_gpu": "throughput"}


def _rows(path: str | Path) -> list[dict]:
    with Path(path).open(newline="") as fh:
        return list(csv.DictReader(fh))


def loss(rows: list[dict], constants: dict) -> float:
    """Mean over metric groups of the mean |log(predicted / measured)|. TTFT counts at a single client only: there
    it is one prefill plus the step's host time, what the constants are; under concurrency it also carries the
    waiting of clients that the request layer models (queue-dominated rows: admission) or does not yet (closed-loop
    clients that arrive together), which fitting the prefill's efficiency to would hide."""
    groups: dict[str, list[float]] = {}
    for row in rows:
        if row.get("metric", "").strip() == "ttft_ms" and row.get("concurrency", "").strip() != "1":
            continue
        try:
            got, _ = predict_row(row, constants)
        except MeshplanError:
            continue
        if got is None or (got.metric == "ttft_ms" and got.queue_dominated):
            continue
        groups.setdefault(GROUPS[got.metric], []).append(abs(math.log(got.predicted / got.measured)))
    return statistics.fmean(statistics.fmean(v) for v in groups.values()) if groups else float("inf")


def keys(rows: list[dict]) -> dict[str, dict[str, list[dict]]]:
    """The constants the rows can inform, each with the rows it moves: the kernel efficiencies per GPU generation
    present, a step time per engine profile present. The GEMM efficiency is read on replicas of one GPU only,
    where no collective shares the step, so that a term the interconnect model lacks (PCIe servers whose TP
    groups cross CPU sockets) cannot hide in it. The host time per sequence belongs to the scheduler's code, one
    per engine family (TensorRT-LLM's C++ executor under trtllm-bench, NIM and MLPerf alike), so a source that
    runs only small batches cannot set it for the others. The all-reduce barrier is per GPU generation: held out,
    an engine family would lose it, and its TP rows would fall back on the HBM efficiency to absorb it."""
    gens: dict[str, list[dict]] = {}
    alone: dict[str, list[dict]] = {}
    engines: dict[str, list[dict]] = {}
    families: dict[str, list[dict]] = {}
    for row in rows:
        try:
            gen = catalog.gpu(named(row, "gpus", "gpu")).generation
            engine = row_engine(row)
        except MeshplanError:
            continue
        engines.setdefault(engine.name, []).append(row)
        families.setdefault(engine.engine, []).append(row)
        gens.setdefault(gen, []).append(row)
        if _one_gpu(row):
            alone.setdefault(gen, []).append(row)
    return {"decode_mem_eff": gens, "decode_kv_eff": gens, "prefill_attn_eff": gens, "engine_gemm_eff": alone,
            "step_host_s": engines, "seq_host_s": families, "allreduce_s": gens}


def _one_gpu(row: dict) -> bool:
    """Whether the row's replica is one GPU (tp = pp = ep = 1; empty columns read as 1)."""
    return all((row.get(k) or "1").strip() in ("", "1") for k in ("tp", "pp", "ep"))


def fit_serving(path: str | Path, rounds: int = 2) -> dict:
    """Constants fitted to the CSV at ``path``."""
    return fit_rows(_rows(path), rounds)


def fit_rows(rows: list[dict], rounds: int = 2) -> dict:
    """Constants fitted to serving rows (a CSV's, or a subset of them: leave-one-source-out). Two rounds of
    coordinate descent: four fit the visible rows 2 % better (loss 0.113 -> 0.110) but travel worse, leave-one-
    source-out ITL 9.6 -> 13.2 % and throughput 8.7 -> 10.8 % (benchmarks/bench_serve_loso.py), the HBM efficiency
    and the all-reduce barrier trading against each other within a fold."""
    consts: dict = {t: {} for t in GRIDS}
    for _ in range(rounds):
        for table, subsets in keys(rows).items():
            for name, subset in subsets.items():
                if loss(subset, consts) == float("inf"):
                    continue  # no row of this engine or generation can be predicted: nothing to fit
                best = min(GRIDS[table], key=lambda v: loss(subset, {**consts, table: {**consts[table], name: v}}))
                consts[table][name] = round(best, 6)
    return consts


def constants_toml(consts: dict, source: str) -> str:
    """The TOML text of fitted constants."""
    lines = [f"# Written by scripts/fit_serving.py from {source}; do not edit by hand."]
    for table in GRIDS:
        lines.append(f"\n[{table}]")
        for name, v in sorted(consts.get(table, {}).items()):
            lines.append(f'"{name}" = {v}')
    return "\n".join(lines) + "\n"
