#!/usr/bin/env python
"""meshplan beside a peer on published serving measurements: NVIDIA AIConfigurator (PyPI ``aiconfigurator``, the
estimator behind ``aiconfigurator cli estimate`` / ``cli default``) predicts every row of
``inference_visible.csv`` it can express, meshplan predicts the same rows (``validate_serving_csv``), and both
tools' errors print side by side per metric, on exactly the rows both predicted, followed by the rows each could
not predict, counted by reason. Takes about a minute: AIConfigurator is called once per distinct configuration.

Usage: python benchmarks/bench_serve_peers.py [inference.csv]

AIConfigurator is imported from ``.venv/peers/aiconfigurator`` (``sys.path``), so the venv's own packages (torch)
stay untouched; without it the script says so and exits 0. Install it there with::

    .venv/bin/pip install --no-deps --target .venv/peers/aiconfigurator aiconfigurator==0.12.0 \\
        aiconfigurator-core==0.12.0 prettytable wcwidth "plotext<6"

numpy, pandas, pyarrow, pyyaml and packaging come from the venv. matplotlib, which AIConfigurator imports only to
draw Pareto plots, is not installed: an empty stand-in is registered when it is absent.

How a row becomes an AIConfigurator query:
  model    llama3.1-8b / -70b / -405b -> meta-llama/Meta-Llama-3.1-{8B,70B,405B} (its bundled configs; -70b also
           stands for Llama-3.3-70B, same architecture).
  system   h100-sxm -> h100_sxm, h200 -> h200_sxm, a100-80gb -> a100_sxm (80 GiB), l40s -> l40s.
  backend  "TensorRT-LLM ..." and "NVIDIA NIM ..." (TRT-LLM engines) -> trtllm; "SGLang" -> sglang; "vLLM" -> vllm;
           each at the database version it ships as ``current`` for that system (printed), not the row's version.
  precision fp8 -> GEMM fp8_static, KV cache fp8, FMHA fp8 (what it infers itself for NVIDIA's ModelOpt FP8 Llama
           checkpoint, the per-tensor recipe of TRT-LLM's tables); bf16 and fp16 -> bfloat16 (it has no fp16 GEMM).
  load     a closed-loop concurrency c -> its aggregated (in-flight batching) estimate at batch_size c, ctx_tokens =
           ISL; an offline run ("max", "offline", "inf") -> its own max-throughput search (``Task.run``, the sweep of
           ``cli default``) with the row's tp/pp fixed, no TTFT/TPOT limit, best output tokens/s; dp replicas split
           the clients and multiply throughput.
  metric   ttft_ms -> ttft; tpot_ms and itl_ms -> tpot (it has no streaming-chunk model); output_tokens_per_s ->
           tokens/s; requests_per_s -> seq/s; e2e_latency_s -> request_latency.

What it cannot express (counted in the output): variable-length datasets (ShareGPT, OpenOrca) and open-loop
request rates (meshplan skips these too); Llama-2-70B (not in its model catalog); GH200 (no system database);
and a closed-loop concurrency whose whole KV cache does not fit, which it calls out of memory because it does not
model queueing. Its estimates are of the current engine versions' kernels, not of TRT-LLM 0.17, NIM 1.8, SGLang
0.3 or vLLM 0.6."""

import csv
import importlib.util
import logging
import re
import statistics
import sys
import time
import types
import warnings
from collections import Counter
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from meshplan.calibrate.serve_cells import OFFLINE
from meshplan.calibrate.serve_validate import validate_serving_csv

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT.parent / "shared" / "validation" / "inference_visible.csv"
PEER_DIR = ROOT / ".venv" / "peers" / "aiconfigurator"
SLOT = "current"
"""Which of its queryable database versions to use per system and backend."""
MODELS = {"llama3.1-8b": "meta-llama/Meta-Llama-3.1-8B", "llama3.1-70b": "meta-llama/Meta-Llama-3.1-70B",
          "llama3.1-405b": "meta-llama/Meta-Llama-3.1-405B"}
SYSTEMS = {"h100-sxm": "h100_sxm", "h200": "h200_sxm", "a100-80gb": "a100_sxm", "l40s": "l40s"}
BACKENDS = (("TensorRT-LLM", "trtllm"), ("NVIDIA NIM", "trtllm"), ("SGLang", "sglang"), ("vLLM", "vllm"))
QUANT = {"fp8": ("fp8_static", "fp8", "fp8"), "bf16": ("bfloat16",) * 3, "fp16": ("bfloat16",) * 3}
"""Row precision -> (GEMM, KV cache, FMHA) quant mode names."""
FIELDS = {"ttft_ms": ("ttft", 1.0), "tpot_ms": ("tpot", 1.0), "itl_ms": ("tpot", 1.0),
          "output_tokens_per_s": ("tokens/s", 1.0), "requests_per_s": ("seq/s", 1.0),
          "e2e_latency_s": ("request_latency", 1e-3)}
"""Our metric -> (its result field, scale to our unit)."""
THROUGHPUT = ("output_tokens_per_s", "requests_per_s")


@dataclass(frozen=True, kw_only=True)
class AicQuery:
    """One distinct AIConfigurator configuration (a cache key)."""

    model: str
    system: str
    backend: str
    precision: str
    tp: int
    pp: int
    isl: int
    osl: int
    batch: int | None
    """Clients per replica; None = offline (its max-throughput search)."""


def load_peer() -> types.SimpleNamespace | None:
    """AIConfigurator's estimate, search and version resolver from ``PEER_DIR``, or None when not installed."""
    if not (PEER_DIR / "aiconfigurator" / "cli" / "api.py").exists():
        return None
    sys.path.insert(0, str(PEER_DIR))
    if importlib.util.find_spec("matplotlib") is None:
        # Imported at module level by its Pareto-plot code only; never called on the estimate and search paths.
        mpl, plt = types.ModuleType("matplotlib"), types.ModuleType("matplotlib.pyplot")
        plt.__getattr__ = lambda name: object
        mpl.pyplot = plt
        sys.modules.update({"matplotlib": mpl, "matplotlib.pyplot": plt})
    warnings.simplefilter("ignore")  # its sweep entry point warns that it moves to `aisimulate` in 0.13
    from aiconfigurator.cli.api import cli_estimate
    from aiconfigurator.sdk import common
    from aiconfigurator.sdk.perf_database import resolve_query_version
    from aiconfigurator.sdk.task_v2 import Task

    for name in ("aiconfigurator", "aiconfigurator_core"):
        logging.getLogger(name).setLevel(logging.ERROR)
    version = f"{metadata.version('aiconfigurator')} (core {metadata.version('aiconfigurator-core')})"
    return types.SimpleNamespace(estimate=cli_estimate, Task=Task, common=common, resolve=resolve_query_version,
                                 version=version)


def _length(text: str) -> int | None:
    return int(text) if text.strip().isdigit() else None


def row_query(row: dict) -> tuple[AicQuery | None, str]:
    """The AIConfigurator configuration of a row, or (None, why it cannot be expressed)."""
    model, system = MODELS.get(row["model_key"].strip()), SYSTEMS.get(row["gpu_key"].strip())
    backend = next((b for prefix, b in BACKENDS if row["framework"].strip().startswith(prefix)), None)
    isl, osl = _length(row["input_len"]), _length(row["output_len"])
    conc = row["concurrency"].strip().lower()
    dp = int(row.get("dp") or 1)
    if isl is None or osl is None:
        return None, "variable input/output lengths (it takes fixed ISL/OSL)"
    if not (conc.isdigit() or conc.startswith(OFFLINE)):
        return None, f"open-loop rate {conc!r} (it takes a closed-loop batch)"
    if model is None:
        return None, f"model {row['model_key']} not in its model catalog"
    if system is None:
        return None, f"GPU {row['gpu_key']} has no system database"
    if backend is None or row["precision"].strip() not in QUANT:
        return None, f"framework/precision {row['framework'][:20]}/{row['precision']} not mapped"
    batch = None if conc.startswith(OFFLINE) else max(1, round(int(conc) / dp))
    return AicQuery(model=model, system=system, backend=backend, precision=row["precision"].strip(),
                    tp=int(row["tp"] or 1), pp=int(row.get("pp") or 1), isl=isl, osl=osl, batch=batch), ""


def _quant(peer, precision: str) -> tuple:
    gemm, kv, fmha = QUANT[precision]
    c = peer.common
    return c.GEMMQuantMode[gemm], c.KVCacheQuantMode[kv], c.FMHAQuantMode[fmha]


def _offline(peer, q: AicQuery, version: str) -> dict:
    """Its max-throughput search at the row's fixed parallelism: best output tokens/s over its batch x ctx-token
    sweep, no latency limit."""
    gemm, kv, fmha = _quant(peer, q.precision)
    gpus = q.tp * q.pp
    task = peer.Task(serving_mode="agg", model_path=q.model, system_name=q.system, backend_name=q.backend,
                     backend_version=version, isl=q.isl, osl=q.osl, ttft=1e12, tpot=1e12, pareto_sweep=False,
                     total_gpus=gpus, agg_num_gpu_candidates=[gpus], agg_tp_candidates=[q.tp],
                     agg_pp_candidates=[q.pp], agg_dp_candidates=[1], gemm_quant_mode=gemm,
                     kvcache_quant_mode=kv, fmha_quant_mode=fmha)
    df = task.run()
    best = df.sort_values(by="tokens/s", ascending=False).iloc[0]
    return {"ttft": best["ttft"], "tpot": best["tpot"], "tokens/s": best["tokens/s"], "seq/s": best["seq/s"],
            "request_latency": best["request_latency"], "kv_warning": False}


def _closed_loop(peer, q: AicQuery, version: str) -> dict:
    """Its aggregated estimate (``cli estimate``) at batch_size = clients per replica."""
    gemm, kv, fmha = QUANT[q.precision]
    res = peer.estimate(q.model, q.system, mode="agg", backend_name=q.backend, backend_version=version, isl=q.isl,
                        osl=q.osl, batch_size=q.batch, tp_size=q.tp, pp_size=q.pp, gemm_quant_mode=gemm,
                        kvcache_quant_mode=kv, fmha_quant_mode=fmha)
    out = {k: float(res.raw[k]) for k in ("ttft", "tpot", "tokens/s", "seq/s", "request_latency")}
    out["kv_warning"] = res.kv_cache_warning is not None
    return out


def _failure(exc: Exception) -> str:
    text = str(exc)
    if text.startswith("OOM") or "does not fit" in text:
        return "out of memory at this batch (weights + whole KV cache; it does not queue)"
    if "KV cache" in text:
        return "KV cache capacity exceeded at every point of its search"
    return f"{type(exc).__name__}: {text[:70]}"


def predict_query(peer, q: AicQuery, versions: dict) -> tuple[dict | None, str]:
    """Its result fields for one configuration, or (None, why it failed)."""
    key = (q.system, q.backend)
    if key not in versions:
        versions[key] = peer.resolve(q.system, q.backend, SLOT)
    try:
        if q.batch is None:
            return _offline(peer, q, versions[key]), ""
        return _closed_loop(peer, q, versions[key]), ""
    except Exception as exc:  # noqa: BLE001 - every failure of the peer is a counted reason, never a crash
        return None, _failure(exc)


def peer_predictions(peer, rows: list[dict]) -> tuple[dict, dict, int]:
    """Per row id its prediction in our unit (``pred``), or the reason it has none (``why``), and the ids whose
    batch exceeds its KV-cache estimate (``kv``); the database version per (system, backend); and the number of
    distinct configurations evaluated."""
    cache, versions, preds, why, kv_flag = {}, {}, {}, {}, set()
    for row in rows:
        q, reason = row_query(row)
        if q is not None:
            if q not in cache:
                cache[q] = predict_query(peer, q, versions)
            raw, reason = cache[q]
            if raw is not None:
                field, scale = FIELDS[row["metric"].strip()]
                dp = int(row.get("dp") or 1)
                preds[row["id"]] = raw[field] * scale * (dp if row["metric"].strip() in THROUGHPUT else 1)
                if raw["kv_warning"]:
                    kv_flag.add(row["id"])
                continue
        why[row["id"]] = reason
    return {"pred": preds, "why": why, "kv": kv_flag}, versions, len(cache)


def _mp_reason(row_id: str, text: str) -> str:
    text = text.removeprefix(row_id + ".")
    return re.sub(r"'[^']*'", "...", text)[:120]


def _stats(errs: list[float]) -> str:
    ape = [abs(e) for e in errs]
    return f"{statistics.fmean(ape):7.1f} {statistics.median(ape):7.1f} {statistics.median(errs):+8.1f}"


def print_side_by_side(report, peer_out: dict, split: dict[str, str] | None = None) -> None:
    """MAPE, median |error| and median signed error (%) of both tools on the rows both predicted, per metric (TTFT
    split by meshplan's queue-dominated flag), and per ``split[row id]`` label within a metric when given."""
    groups: dict[str, list[tuple[float, float]]] = {}
    for r in report.rows:
        if r.id not in peer_out["pred"]:
            continue
        key = r.metric + (" (queue-dominated)" if r.metric == "ttft_ms" and r.queue_dominated else "")
        key += f" [{split[r.id]}]" if split else ""
        aic = 100.0 * (peer_out["pred"][r.id] - r.measured) / r.measured
        groups.setdefault(key, []).append((r.error_pct, aic))
    head = f"{'MAPE':>7s} {'med|e|':>7s} {'med e':>8s}"
    print(f"{'group':40s} {'n':>4s}  meshplan {head}  AIConfigurator {head}")
    for key in sorted(groups):
        mp, aic = zip(*groups[key])
        print(f"{key:40s} {len(mp):4d}  {'':8s} {_stats(list(mp))}  {'':14s} {_stats(list(aic))}")


def print_meshplan_only(report, peer_out: dict) -> None:
    """meshplan's errors on the rows AIConfigurator could not predict: GH200, and its out-of-memory rows (long
    contexts at high concurrency, where the server queues)."""
    groups: dict[str, list[float]] = {}
    for r in report.rows:
        if r.id in peer_out["why"]:
            key = r.metric + (" (queue-dominated)" if r.metric == "ttft_ms" and r.queue_dominated else "")
            groups.setdefault(key, []).append(r.error_pct)
    print(f"meshplan on the {sum(map(len, groups.values()))} rows only it predicted")
    print(f"{'group':40s} {'n':>4s}  meshplan {'MAPE':>7s} {'med|e|':>7s} {'med e':>8s}")
    for key in sorted(groups):
        print(f"{key:40s} {len(groups[key]):4d}  {'':8s} {_stats(groups[key])}")


def print_unpredicted(rows: list[dict], report, peer_out: dict) -> None:
    """Rows each tool could not predict, by reason, with a per-metric count."""
    metric = {r["id"]: r["metric"].strip() for r in rows}
    mp_why = {i: _mp_reason(i, w) for i, w in report.skipped}
    mp_why.update({i: "predicted out of memory although it ran" for i, _ in report.false_oom})
    for tool, why in (("meshplan", mp_why), ("AIConfigurator", peer_out["why"])):
        print(f"{tool}: {len(why)} of {len(rows)} rows not predicted")
        tally = Counter(why.values())
        for reason, n in tally.most_common():
            per = Counter(metric[i] for i, w in why.items() if w == reason)
            print(f"  {n:4d}  {reason}  ({', '.join(f'{m} {c}' for m, c in sorted(per.items()))})")


def main() -> int:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    peer = load_peer()
    if peer is None:
        print(f"bench_serve_peers: AIConfigurator not installed under {PEER_DIR}; skipped (see the module docstring)")
        return 0
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    t0 = time.perf_counter()
    report = validate_serving_csv(path)
    t1 = time.perf_counter()
    peer_out, versions, n_cfg = peer_predictions(peer, rows)
    t2 = time.perf_counter()
    print(f"{path.name}: {len(rows)} rows; meshplan {t1 - t0:.1f} s; AIConfigurator {peer.version}, "
          f"{n_cfg} distinct configurations, {t2 - t1:.1f} s")
    print("AIConfigurator databases: " + ", ".join(f"{s}/{b} {v}" for (s, b), v in sorted(versions.items())))
    both = sum(1 for r in report.rows if r.id in peer_out["pred"])
    kv = sum(1 for r in report.rows if r.id in peer_out["kv"])
    print(f"\nrows both predicted: {both} ({kv} of them with its KV-capacity warning); errors in %, "
          "e = predicted - measured over measured")
    print_side_by_side(report, peer_out)
    for split in ({r.id: r.engine for r in report.rows}, {r["id"]: r["gpu_key"] for r in rows}):
        print()
        print_side_by_side(report, peer_out, split)
    print()
    print_meshplan_only(report, peer_out)
    print()
    print_unpredicted(rows, report, peer_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
