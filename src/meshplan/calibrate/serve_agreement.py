"""``check --serve`` without torch: the sweep of serving cases, the serving model's prediction of each on this
host's calibrated profile with the runtime's engine profile (``catalog/engines/meshplan.toml``), and the
agreement of prediction and measurement (MAPE, Kendall tau, regret), per metric."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, replace

from meshplan import catalog
from meshplan.calibrate.agreement import kendall_tau, mape_pct, regret_pct
from meshplan.calibrate.serve_constants import load_constants
from meshplan.cost.serve_load import predict_load
from meshplan.cost.serve_step import step_context
from meshplan.errors import SpecError
from meshplan.spec.model import ModelSpec
from meshplan.spec.serving import ServePlan, Workload


@dataclass(frozen=True, kw_only=True)
class ServeCase:
    """One configuration of the sweep."""

    model: str
    tp: int
    clients: int
    """Closed-loop clients of the whole deployment (split evenly over the replicas)."""
    input_len: int
    output_len: int
    requests: int
    """Requests of the whole deployment (the first ``clients`` form the start-up wave)."""
    seed: int = 0

    def label(self) -> str:
        return f"tp{self.tp} c={self.clients} in={self.input_len} out={self.output_len}"

    def to_dict(self) -> dict:
        return asdict(self)


SHAPES = ((32, 16, 1), (32, 16, 4), (128, 16, 4), (64, 32, 8))
"""(input, output, clients) of the default sweep, each under every TP degree the world allows."""


def check_decodable(spec: ModelSpec) -> None:
    """The serving runtime decodes grouped-query attention with RoPE or no positions (dense or MoE)."""
    for b in spec.blocks:
        if b.layer.attention is not None and b.layer.attention.kind == "mla":
            raise SpecError("--model", spec.name, "check --serve decodes grouped-query attention (MLA is not wired "
                            "to the KV cache yet)")
    if spec.position == "learned":
        raise SpecError("--model", spec.name, "check --serve needs RoPE or no positions (learned positions are not "
                        "batched per sequence)")


def default_cases(model: str, nproc: int, *, requests_per_client: int = 2) -> list[ServeCase]:
    """At least 8 cases: every SHAPES entry at tp = 1 (nproc replicas) and tp = nproc (one replica)."""
    tps = sorted({1, nproc})
    out = []
    for tp in tps:
        replicas = nproc // tp
        for inp, outp, clients in SHAPES:
            c = max(clients, replicas)
            c -= c % replicas
            out.append(ServeCase(model=model, tp=tp, clients=c, input_len=inp, output_len=outp,
                                 requests=max(requests_per_client * c, c + replicas)))
    return out


def predict_case(case: ServeCase, hardware: str, world: int) -> tuple[float, float]:
    """Predicted (mean TTFT, mean TPOT) of a case (s)."""
    replicas = world // case.tp
    engine = replace(catalog.engine("meshplan"), max_num_seqs=case.clients // replicas)
    # the runtime on a CPU computes, stores weights and caches keys and values in fp32
    plan = ServePlan(tp=case.tp, replicas=replicas, precision="fp32", kv_dtype="fp32", engine="meshplan")
    pool = catalog.cluster(f"{case.tp}x{hardware}").pools[0]
    ctx = step_context(catalog.model(case.model), pool, plan, engine, load_constants())
    pred = predict_load(ctx, Workload(input_len=case.input_len, output_len=case.output_len,
                                      concurrency=case.clients), replicas=replicas)
    return pred.ttft, pred.tpot


def measured(rows: list[dict]) -> tuple[float, float]:
    """Measured (TTFT, TPOT) of a case, each the median over its requests (a shared machine's hiccups only add
    time to some; with fixed lengths the median and the mean the model predicts coincide): TTFT over requests
    after the start-up wave (the model is the steady state; the first wave's prefills queue behind each other),
    all of them when there is no later one."""
    steady = [r for r in rows if not r["start_wave"]] or rows
    return statistics.median(r["ttft_s"] for r in steady), statistics.median(r["tpot_s"] for r in rows)


def agreement(labels: list[str], pred: list[float], meas: list[float]) -> dict:
    """Per-case rows and MAPE, Kendall tau and regret of the predicted-best case."""
    rows = [{"case": lab, "predicted_s": p, "measured_s": m, "error_pct": 100.0 * (p - m) / m}
            for lab, p, m in zip(labels, pred, meas)]
    return {"cases": rows, "mape_pct": mape_pct(pred, meas), "kendall_tau": kendall_tau(pred, meas),
            "regret_pct": regret_pct(pred, meas)}
