"""Views of a serving-search result: the ranked table, the throughput/interactivity Pareto front, the
explanation of the winner (or, when nothing meets the SLOs, why and the nearest option), and the JSON document."""

from __future__ import annotations

from io import StringIO

from meshplan.search.serve_explain import Explanation
from meshplan.search.serve_request import ServeCandidate, ServeResult


def _ms(x: float) -> str:
    return f"{1e3 * x:,.0f}" if x >= 0.1 else f"{1e3 * x:,.1f}"


def headline(result: ServeResult) -> str:
    """What was asked, in one line."""
    req = result.request
    w = req.work
    load = (f"{w.concurrency} concurrent clients" if w.concurrency else f"{w.rate:g} requests/s (Poisson)" if w.rate
            else "offline (all requests queued)")
    slo = [f"TTFT {_ms(req.slo.ttft)} ms" if req.slo.ttft else "", f"TPOT {_ms(req.slo.tpot)} ms" if req.slo.tpot
           else ""]
    slo_text = " and ".join(s for s in slo if s) or "none"
    var = " (mean of a histogram)" if w.input_hist or w.output_hist else ""
    sp = req.speculation
    if sp is None:
        spec = ""
    elif req.draft_options:
        spec = (f"; speculative {sp.method}{' ' + sp.checkpoint if sp.checkpoint else ''}, "
                f"{min(req.draft_options)}-{max(req.draft_options)} drafts searched at {sp.acceptance:.2f} acceptance")
    else:
        spec = (f"; speculative {sp.method}{' ' + sp.checkpoint if sp.checkpoint else ''}, {sp.draft_tokens} drafts "
                f"at {sp.acceptance:.2f} acceptance ({sp.tokens_per_pass:.2f} tokens per pass)")
    return (f"{req.model.name} on {req.cluster.describe()} with {req.engine.name} ({req.engine.version}): "
            f"{w.input_len:,} in / {w.output_len:,} out tokens{var}, {load}, {req.precision} weights, "
            f"{req.kv_dtype} KV{spec}; "
            f"SLOs {slo_text} at p{round(100 * req.slo.percentile)}; objective {req.objective}")


def candidate_row(result: ServeResult, c: ServeCandidate) -> dict:
    """JSON view of one deployment."""
    p = c.pred
    row = {"layout": c.label(), "disaggregated": c.disaggregated, "meets_slo": c.meets, "misses": list(c.misses),
           "gpus": c.gpus, "plan": _plan_dict(c.plan), "prefill": _plan_dict(c.prefill) if c.prefill else None,
           "max_num_seqs": c.engine.max_num_seqs,
           "at_percentile": {f"{k}_ms": 1e3 * v for k, v in c.tails.items()},
           "mean": {"ttft_ms": 1e3 * p.ttft, "tpot_ms": 1e3 * p.tpot, "itl_ms": 1e3 * p.itl, "e2e_s": p.e2e},
           "output_tokens_per_s": p.output_tokens_per_s, "output_tokens_per_s_per_gpu": p.tokens_per_s_per_gpu,
           "requests_per_s": p.requests_per_s, "resident_per_replica": p.resident,
           "kv_capacity_tokens_per_replica": p.kv_capacity_tokens, "kv_occupancy": p.kv_occupancy,
           "limited_by": p.limited_by, "queue_wait_ms": 1e3 * p.queue_wait, "kv_transfer_ms": 1e3 * p.kv_transfer}
    price = result.request.dollars_per_gpu_hour
    if price:
        row["dollars_per_million_tokens"] = price * c.gpus / 3600 / max(p.output_tokens_per_s, 1e-12) * 1e6
    return row


def _gpus_of(label: str) -> int:
    """GPUs of a layout label such as ``1xtp4pp2``."""
    import re

    n = 1
    for v in re.findall(r"(?:tp|adp|pp)(\d+)", label):
        n *= int(v)
    return n


def _plan_dict(p) -> dict:
    sp = p.speculation
    spec = None if sp is None else {"method": sp.method, "draft_tokens": sp.draft_tokens, "acceptance": sp.acceptance,
                                    "tokens_per_pass": sp.tokens_per_pass, "draft": sp.checkpoint or None}
    return {"tp": p.tp, "pp": p.pp, "ep": p.ep, "attn_dp": p.attn_dp, "replicas": p.replicas, "precision": p.precision,
            "kv_dtype": p.kv_dtype, "engine": p.engine, "speculation": spec}


def result_json(result: ServeResult, why: Explanation, top: int) -> dict:
    """The JSON document of ``meshplan serve --json``."""
    best = result.best
    return {"request": headline(result), "meets_slo": best is not None,
            "best": candidate_row(result, best) if best else None,
            "candidates": [candidate_row(result, c) for c in result.candidates[:top]],
            "pareto": [candidate_row(result, c) for c in result.pareto()],
            "explanation": {"token_time": dict(why.token_time), "limits": list(why.limits),
                            "runners_up": [{"layout": a, "why": b} for a, b in why.runners_up],
                            "nearest": list(why.nearest), "benchmark": why.benchmark or None},
            "infeasible": [{"layout": a, "reason": b} for a, b in result.infeasible],
            "evaluated": len(result.candidates)}


def _table(result: ServeResult, top: int, width: int):
    from rich.table import Table

    pct = f"p{round(100 * result.request.slo.percentile)}"
    t = Table(title=f"best deployments ({len(result.candidates)} evaluated)", expand=False)
    compact = width < 120
    cols = ["#", "layout", "GPUs", "tok/s/GPU", f"TTFT {pct} ms", f"TPOT {pct} ms", "batch", "limit", "SLO"]
    if not compact:
        cols[7:7] = ["tok/s", "max seqs"]
    for col in cols:
        t.add_column(col, justify="left" if col in ("layout", "limit", "SLO") else "right")
    for i, c in enumerate(result.candidates[:top], 1):
        cells = [str(i), c.label(), str(c.gpus), f"{c.pred.tokens_per_s_per_gpu:,.0f}", _ms(c.tails["ttft"]),
                 _ms(c.tails["tpot"]), str(c.pred.resident), c.pred.limited_by, "ok" if c.meets else "miss"]
        if not compact:
            cells[7:7] = [f"{c.pred.output_tokens_per_s:,.0f}", str(c.engine.max_num_seqs)]
        t.add_row(*cells)
    return t


def render_text(result: ServeResult, why: Explanation, *, top: int = 5, width: int = 100) -> str:
    """Readable report in ``width`` columns."""
    from rich.console import Console

    buf = StringIO()
    con = Console(file=buf, width=width, force_terminal=False, no_color=True, highlight=False)
    con.print(headline(result))
    if not result.candidates:
        leanest = min(result.infeasible, key=lambda r: -_gpus_of(r[0]), default=("", "no layout"))
        con.print("NOTHING FITS: " + leanest[1])
        for line in why.nearest:
            con.print(f"  {line}")
        return buf.getvalue()
    con.print(_table(result, top, width))
    best = result.best
    if best is None:
        con.print("NOTHING MEETS THE SLOs")
        for line in why.nearest:
            con.print(f"  {line}")
    else:
        con.print(f"winner: {best.label()} ({best.engine.name}, max_num_seqs {best.engine.max_num_seqs}): "
                  f"{best.pred.tokens_per_s_per_gpu:,.0f} output tokens/s per GPU, "
                  f"{best.pred.requests_per_s:.2f} requests/s")
        con.print("  a token's time: " + ", ".join(f"{name} {100 * share:.0f} %" for name, share in why.token_time))
        for line in why.limits:
            con.print(f"  {line}")
        spare = result.request.cluster.n_gpus - best.gpus
        if spare > 0:
            con.print(f"  it uses {best.gpus} of the {result.request.cluster.n_gpus} GPUs (most tokens/s per GPU at "
                      f"this load); the other {spare} can serve more load or another model")
        for label, reason in why.runners_up:
            con.print(f"  {label}: {reason}")
    con.print("throughput/interactivity Pareto front: " + "; ".join(
        f"{c.pred.tokens_per_s_per_gpu:,.0f} tok/s/GPU @ {1 / max(c.tails['tpot'], 1e-9):,.0f} tok/s/user "
        f"({c.label()})" for c in result.pareto()[:6]))
    if result.infeasible:
        con.print(f"{len(result.infeasible)} layouts cannot hold the weights and one request, e.g. "
                  f"{result.infeasible[0][1]}")
    return buf.getvalue()
