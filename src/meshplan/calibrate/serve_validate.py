"""Hold the serving model against published serving measurements (``inference_visible.csv``; conventions in
shared/validation/INFERENCE.md): per-row signed error, MAPE per metric, TTFT split into queue-dominated and not,
and every row predicted "out of memory" although it ran (must be none)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from meshplan import catalog
from meshplan.calibrate.csvfile import csv_rows
from meshplan.calibrate.serve_cells import (
    SCENARIOS,
    length_bins,
    measured_value,
    row_load,
    row_statistic,
    stated_cell,
    weight_format,
    whole_cell,
)
from meshplan.cost.serve_capacity import sustainable_rate
from meshplan.cost.serve_load import ServePrediction, fit_check, predict_load
from meshplan.cost.serve_sizing import sized_engine, with_cap
from meshplan.cost.serve_step import StepContext, step_context
from meshplan.cost.serve_tail import quantile
from meshplan.errors import MeshplanError, SpecError
from meshplan.sim.serve_run import benchmark_run
from meshplan.spec.engine import EngineProfile
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import precision_name
from meshplan.spec.serving import Scenario, ServePlan, Workload, workload_from_hist

REQUIRED = ("id", "model_key", "gpu_key", "tp", "precision", "framework", "input_len", "output_len", "concurrency",
            "metric", "value")
METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_latency_s", "output_tokens_per_s", "total_tokens_per_s",
           "requests_per_s", "tokens_per_s_per_gpu")
"""The metrics of INFERENCE.md's ``metric`` column."""


@dataclass(frozen=True, kw_only=True)
class ServeRow:
    """One measurement's prediction."""

    id: str
    metric: str
    engine: str
    gpu: str
    measured: float
    predicted: float
    queue_dominated: bool

    @property
    def error_pct(self) -> float:
        """Signed error, positive = predicted above measured (%)."""
        return 100.0 * (self.predicted - self.measured) / self.measured


@dataclass(frozen=True, kw_only=True)
class ServeReport:
    """Every predicted row, the skipped rows and the rows called out of memory although they ran."""

    rows: tuple[ServeRow, ...]
    skipped: tuple[tuple[str, str], ...]
    false_oom: tuple[tuple[str, str], ...]

    def groups(self) -> dict[str, list[ServeRow]]:
        """Rows by metric, TTFT split into queue-dominated and not."""
        out: dict[str, list[ServeRow]] = {}
        for r in self.rows:
            key = r.metric + (" (queue-dominated)" if r.metric == "ttft_ms" and r.queue_dominated else "")
            out.setdefault(key, []).append(r)
        return out

    def summary(self, by: tuple[str, ...] = ()) -> dict[str, dict[str, float]]:
        """Per group (the metric, TTFT split by queueing; then each field of ``by``: ``engine``, ``gpu``): n,
        MAPE, median and max absolute error (%)."""
        groups: dict[str, list[ServeRow]] = {}
        for key, rows in self.groups().items():
            for r in rows:
                sub = " ".join(f"/ {getattr(r, f)}" for f in by)
                groups.setdefault(f"{key} {sub}".strip(), []).append(r)
        out = {}
        for key, rows in sorted(groups.items()):
            ape = [abs(r.error_pct) for r in rows]
            out[key] = {"n": len(rows), "mape_pct": statistics.fmean(ape), "median_ape_pct": statistics.median(ape),
                        "max_ape_pct": max(ape)}
        return out

    def as_dict(self) -> dict:
        """The JSON shape of ``meshplan validate --json`` on a serving CSV."""
        return {"rows": [{"id": r.id, "metric": r.metric, "engine": r.engine, "gpu": r.gpu, "measured": r.measured,
                          "predicted": r.predicted, "error_pct": r.error_pct, "queue_dominated": r.queue_dominated}
                         for r in self.rows],
                "summary": self.summary(), "by_engine": self.summary(("engine",)), "by_gpu": self.summary(("gpu",)),
                "false_oom": [{"id": i, "reason": w} for i, w in self.false_oom],
                "skipped": [{"id": i, "reason": w} for i, w in self.skipped]}


def is_serving_csv(header: list[str] | None) -> bool:
    """A CSV in the serving schema (``metric`` and ``value`` columns beside the layout)."""
    return bool(header) and all(k in header for k in REQUIRED)


def row_engine(row: dict) -> EngineProfile:
    """The engine profile of the row's ``framework`` column (``catalog.engine_for``: a source's own setup by its
    ``matches`` prefix, else the family's nearest version-default profile)."""
    try:
        return catalog.engine_for(row["framework"])[0]
    except SpecError as exc:
        raise SpecError(f"{row['id']}.framework", row["framework"].strip(), exc.expected) from None


def row_scenario(row: dict) -> Scenario | None:
    """The latency-bound scenario a row's ``concurrency`` names, with its dataset's constraints, or None."""
    conc = (row.get("concurrency") or "").strip().lower()
    name = next((s for s in SCENARIOS if conc.startswith(s)), "")
    if not name:
        return None
    named = catalog.dataset_for(row.get("input_len") or "")
    if named is None or not named.scenarios:
        with_scenarios = [d for d in catalog.dataset_names() if catalog.dataset(d).scenarios]
        raise SpecError(f"{row['id']}.concurrency", conc, "a benchmark scenario needs a dataset that defines its "
                        f"latency constraints ({', '.join(with_scenarios) or 'none in the catalog'})")
    try:
        return named.scenario(name)
    except SpecError as exc:
        raise SpecError(f"{row['id']}.concurrency", conc, exc.expected) from None


def row_workload(row: dict) -> Workload:
    """The workload of a row: fixed lengths or a catalog dataset's ("ShareGPT (variable)"), under its load."""
    load = row_load(row)
    named = catalog.dataset_for(row.get("input_len") or "")
    if named is not None:
        return named.workload(**load)
    bins = [length_bins(row.get(key) or "", f"{row['id']}.{key}") for key in ("input_len", "output_len")]
    if None in bins:  # a dataset named for the output only: the prompt must be given as well
        raise SpecError(f"{row['id']}.input_len", row.get("input_len") or "", "must name the dataset the output "
                        "length names, or be a number of tokens beside a number of output tokens")
    return workload_from_hist(bins[0], bins[1], **load)


PRECISION_NAMES = {"nvfp4": "fp4", "mxfp4": "fp4", "awq": "int4", "gptq": "int4", "w4a16": "int4", "int4-awq": "int4"}
"""Weight formats sources name, by the precision the step model prices: NVFP4 (16-element blocks) and the OCP
MXFP4 (32-element blocks, e8m0 scales) both run on FP4 tensor cores (Blackwell, CDNA 4), priced at NVFP4's 4.5
bits a weight (MXFP4 stores 4.25: its decode weight reads come out 6 % high); AWQ/GPTQ are 4-bit integer weights
with 16-bit compute."""


def row_plan(row: dict, engine: EngineProfile) -> ServePlan:
    """The deployment of a row: tp, pp and data-parallel replicas at the row's precision; fp8 weights also mean
    an fp8 KV cache on engines whose fp8 recipe quantizes it (``fp8_kv``). Experts over more GPUs than the TP
    group (``ep`` a multiple of ``tp``) mean attention data parallelism over them (vLLM's ``--data-parallel-size``
    with ``--enable-expert-parallel``, SGLang's ``--enable-dp-attention``): ``ep / tp`` attention groups per
    replica, the replicas being the row's GPUs over theirs."""
    prec = precision_name(row["precision"])
    prec = weight_format(row["precision"]) or PRECISION_NAMES.get(prec, prec)
    kv = "fp8" if prec in ("fp8", "fp4") and engine.fp8_kv else ("fp16" if prec == "fp16" else "bf16")
    tp = whole_cell(row, "tp", _unstated_tp(row))
    pp, ep, dp = (whole_cell(row, k, 1) for k in ("pp", "ep", "dp"))
    for name, value in (("tp", tp), ("pp", pp), ("ep", ep), ("dp", dp)):
        if value < 1:
            raise SpecError(f"{row['id']}.{name}", row[name].strip(), "must be a whole number >= 1 (empty: 1)")
    n_gpus = (row.get("n_gpus") or "").strip()
    stated = int(n_gpus) if n_gpus.isdigit() else 0
    if stated and dp > 1 and stated == tp * pp and tp % dp == 0:
        # SGLang's --tp N --dp D --enable-dp-attention: N GPUs in all, D attention groups of N / D, the experts
        # over all N (sglang server_args.py: dp_size divides tp_size under enable_dp_attention)
        tp, ep, dp = tp // dp, max(ep, tp), 1
    adp = ep // tp if ep > tp and ep % tp == 0 else 1
    replicas = dp
    if adp > 1:
        replicas = max(stated // (tp * pp * adp), 1) if stated else max(dp // adp, 1)
    elif stated and not stated_cell(row, "dp") and stated % (tp * pp) == 0:
        replicas = stated // (tp * pp)  # as an unstated tp is read: the GPUs the row states over tp x pp
    try:
        plan = ServePlan(tp=tp, pp=pp, ep=ep, attn_dp=adp, replicas=replicas, precision=prec, kv_dtype=kv,
                         engine=engine.name)
    except SpecError as exc:
        name = exc.field.removeprefix("serve.")
        if name == "ep":
            raise SpecError(f"{row['id']}.ep", ep, f"{exc.expected} (tp={tp}, pp={pp})") from None
        value = row["precision"].strip() if name == "precision" else exc.value
        context = f" (ep={ep} over tp={tp}: ep / tp attention groups)" if name == "attn_dp" else ""
        raise SpecError(f"{row['id']}.{name}", value, exc.expected + context, exc.suggestions) from None
    if stated and plan.gpus_per_replica * plan.replicas > stated:
        raise SpecError(f"{row['id']}.n_gpus", stated, f"is fewer than the {plan.gpus_per_replica * plan.replicas} "
                        "GPUs of the row's layout (tp x pp x dp)")
    return plan


def _unstated_tp(row: dict) -> int:
    """The TP degree of a row that leaves ``tp`` empty but states its GPUs: what they leave over pp x dp (one GPU
    per replica stage would not hold what needed the rest), else 1."""
    n_gpus, rest = (row.get("n_gpus") or "").strip(), whole_cell(row, "pp", 1) * whole_cell(row, "dp", 1)
    if n_gpus.isdigit() and rest >= 1 and int(n_gpus) % rest == 0:
        return max(int(n_gpus) // rest, 1)
    return 1


def check_layout(row: dict, model: ModelSpec, plan: ServePlan) -> None:
    """Every engine splits attention heads evenly over the TP group and gives each pipeline stage whole layers
    (vLLM ``verify_with_parallel_config``): a tp that does not divide the heads, or more stages than layers, is no
    deployment that ran."""
    att = model.decoder.attention
    if att is not None and att.n_heads % plan.tp:
        raise SpecError(f"{row['id']}.tp", plan.tp, f"must divide {model.name}'s {att.n_heads} attention heads")
    n_layers = sum(1 for _ in model.layers())
    if plan.pp > n_layers:
        raise SpecError(f"{row['id']}.pp", plan.pp, f"must be at most {model.name}'s {n_layers} layers")


def check_experts(row: dict, model: ModelSpec, plan: ServePlan, engine: EngineProfile) -> None:
    """A row's expert parallelism must be one the serving model lays out: whole experts over the GPUs that run
    them (``ep`` dividing them and the expert count), attention data parallelism only on an engine that runs it,
    and a dense model has no experts to split."""
    if plan.ep == 1:
        return
    moe = model.decoder.moe
    if moe is None:
        raise SpecError(f"{row['id']}.ep", plan.ep, f"{model.name} has no experts (dense): ep must be 1")
    if moe.n_experts % plan.ep:
        raise SpecError(f"{row['id']}.ep", plan.ep, f"must divide the {moe.n_experts} experts")
    if plan.attn_dp > 1 and not engine.attention_dp:
        raise SpecError(f"{row['id']}.ep", plan.ep, f"experts beyond tp={plan.tp} mean data-parallel attention, "
                        f"which {engine.name} does not run")


def named(row: dict, kind: str, column: str) -> str:
    """The catalog entry a row's ``model_key`` (``gpu_key``) names; where the key names none, the one its
    ``model`` (``gpu``) column names as the source printed it (``Llama-3.3-70B-Instruct``, ``H100-SXM-80GB``),
    else the key as given (its lookup says what is wrong with it)."""
    key = (row.get(f"{column}_key") or "").strip()
    if key.endswith((".toml", ".json")) or "/" in key:  # a file, or an id the lookup reads (a path wins)
        return key
    if catalog.resolve(kind, key) is None:
        printed = catalog.resolve(kind, (row.get(column) or "").strip())
        return printed or key
    return key


def row_context(row: dict, constants: dict) -> tuple[StepContext, ServePlan, Workload]:
    """A row's replica as the step model sees it (the engine sized for the workload, the source's pinned
    running-batch cap), its deployment and its workload."""
    engine = row_engine(row)
    n_gpus = (row.get("n_gpus") or "").strip()
    if n_gpus.isdigit() and int(n_gpus) < 1:  # a count the row states (other text there is the source's, unread)
        raise SpecError(f"{row['id']}.n_gpus", row["n_gpus"], "must be a whole number of GPUs >= 1")
    plan, work = row_plan(row, engine), row_workload(row)
    model, gpu = catalog.model(named(row, "models", "model")), catalog.gpu(named(row, "gpus", "gpu"))
    cluster = catalog.cluster(f"{plan.gpus_per_replica}x{gpu.name}")
    check_layout(row, model, plan)
    check_experts(row, model, plan, engine)
    if engine.max_pp and plan.pp > engine.max_pp:
        raise SpecError(f"{row['id']}.pp", plan.pp, f"{engine.name} runs at most {engine.max_pp} pipeline stage(s)")
    engine = sized_engine(engine, model, plan, cluster.pools[0], work)
    if stated_cell(row, "batch"):  # the source's running-batch cap (MLPerf gpu_batch_size) is pinned
        engine = with_cap(engine, whole_cell(row, "batch", 1))
    return step_context(model, cluster.pools[0], plan, engine, constants), plan, work


def predict_row(row: dict, constants: dict) -> tuple[ServeRow | None, str]:
    """The prediction of one row, or (None, why it is out of memory)."""
    metric = row["metric"].strip()
    if metric not in METRICS:
        raise SpecError(f"{row['id']}.metric", metric, f"must be one of {', '.join(METRICS)}")
    ctx, plan, work = row_context(row, constants)
    engine, gpu = ctx.engine, ctx.pool.gpu
    oom = fit_check(ctx, work)
    if oom is not None:
        return None, oom.reason
    scenario = row_scenario(row)
    if scenario is None:
        pred = predict_load(ctx, work, replicas=plan.replicas)
    else:
        cap = sustainable_rate(ctx, work, replicas=plan.replicas, ttft=scenario.ttft, tpot=scenario.tpot,
                               q=scenario.percentile)
        if cap.prediction is None:
            return None, (f"no rate meets the {scenario.name} scenario's p{100 * scenario.percentile:g} "
                          f"TTFT {1e3 * scenario.ttft:g} ms / TPOT {1e3 * scenario.tpot:g} ms")
        pred = cap.prediction
    measured = measured_value(row["value"])
    if measured is None or not 0 < measured < math.inf:
        raise SpecError(f"{row['id']}.value", row["value"], "must be a positive, finite measurement")
    q = row_statistic(row)
    value = reported(pred, metric, engine, q)
    if metric == "ttft_ms" and work.concurrency > 1:  # clients that start together: replay the benchmark run
        value = 1e3 * _statistic(benchmark_run(ctx, work, replicas=plan.replicas).ttft, engine, q)
    return ServeRow(id=row["id"], metric=metric, engine=engine.name, gpu=gpu.name, measured=measured,
                    predicted=value, queue_dominated=pred.queue_dominated), ""


def _statistic(values: tuple[float, ...], engine: EngineProfile, q: float | None = None) -> float:
    """The mean, or the q-quantile (linear between order statistics) where the row names one, else the median
    where the harness profile says its source publishes medians."""
    q = (0.5 if engine.reports == "median" else 0.0) if q is None else q
    if not q:
        return statistics.fmean(values)
    ranked = sorted(values)
    at = q * (len(ranked) - 1)
    lo = int(at)
    return ranked[lo] + (ranked[min(lo + 1, len(ranked) - 1)] - ranked[lo]) * (at - lo)


LATENCIES = {"ttft_ms": ("ttft", 1e3), "tpot_ms": ("tpot", 1e3), "itl_ms": ("itl", 1e3), "e2e_latency_s": ("e2e", 1.0)}
"""Latency metrics by their ``serve_tail`` name and unit scale."""


def reported(pred: ServePrediction, metric: str, engine: EngineProfile, q: float | None = None) -> float:
    """The prediction as the row reports it: a latency's q-quantile (``serve_tail.quantile``) where the row names
    one (``serve_cells.row_statistic``), else its median where the harness profile says its source publishes
    medians, else the mean."""
    q = (0.5 if engine.reports == "median" else 0.0) if q is None else q
    if q and metric in LATENCIES:
        name, scale = LATENCIES[metric]
        return scale * quantile(pred, name, q)
    return pred.metric(metric)


def validate_serving_csv(path: str | Path, constants: dict | None = None) -> ServeReport:
    """Predict every expressible row of a serving CSV."""
    from meshplan.calibrate.serve_constants import load_constants

    consts = load_constants() if constants is None else constants
    p = Path(path)
    rows, skipped, oom = [], [], []

    def check_header(header: list[str] | None) -> None:
        if not is_serving_csv(header):
            raise SpecError("file", str(p), f"is not a serving CSV: needs columns {', '.join(REQUIRED)}")

    for line, row, bad in csv_rows(p, check_header):
        row = {k: v if isinstance(v, str) else "" for k, v in row.items() if k is not None}  # a short line's cells
        rid = row.get("id") or f"line {line}"
        try:
            if bad:
                raise MeshplanError(bad)
            got, why = predict_row({**row, "id": rid}, consts)
        except MeshplanError as exc:
            skipped.append((rid, str(exc)))
            continue
        if got is None:
            oom.append((rid, why))
        else:
            rows.append(got)
    if not rows:
        first = skipped[0] if skipped else oom[0] if oom else None
        why = f"; first: {first[0]}: {first[1]}" if first else ": it has no rows"
        raise SpecError("file", str(p), f"no row could be predicted ({len(skipped)} skipped, {len(oom)} out of "
                        f"memory){why}")
    return ServeReport(rows=tuple(rows), skipped=tuple(skipped), false_oom=tuple(oom))
