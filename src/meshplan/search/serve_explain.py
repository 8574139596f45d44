"""Why the serving search chose what it chose: where the winner's token time goes, what caps its batch, why each
runner-up loses, and, when nothing meets the SLOs, the reason and the nearest option that would (a looser SLO,
an fp8 KV cache, more GPUs, or less load), each found by searching again, not guessed."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace

from meshplan.cost.serve_capacity import sustainable_rate
from meshplan.cost.serve_load import predict_load
from meshplan.cost.serve_spec import tokens_per_pass
from meshplan.cost.serve_step import decode_breakdown, step_budget, step_context
from meshplan.search.serve import search
from meshplan.search.serve_request import ServeCandidate, ServeRequest, ServeResult
from meshplan.sim.serve_run import benchmark_run

SHARES = (("weights", ("gemm", "head")), ("KV reads", ("attention",)), ("TP all-reduce", ("allreduce",)),
          ("norms, activations and small kernels", ("elementwise",)),
          ("host and launches", ("host", "launches", "dispatch")),
          ("pipeline sends", ("pp_sends",)), ("drafting", ("draft",)))
"""How a decode step's parts are named for a user."""
MORE_GPUS = (2, 4)
"""Cluster sizes (multiples of the given one) tried for the nearest option."""


@dataclass(frozen=True, kw_only=True)
class Explanation:
    """Readable sentences about a search result."""

    token_time: tuple[tuple[str, float], ...]
    """(part, share of a generated token's time) of the winner, largest first."""
    limits: tuple[str, ...]
    """What caps the winner's batch and makes up its first-token time."""
    runners_up: tuple[tuple[str, str], ...]
    """(layout, why it loses) for the next candidates."""
    nearest: tuple[str, ...] = ()
    """When nothing meets the SLOs: why, and what would."""
    benchmark: dict = field(default_factory=dict)
    """A closed loop's winner: what its exported benchmark run should report (``sim.serve_run``), else empty."""


def token_time(req: ServeRequest, c: ServeCandidate) -> list[tuple[str, float]]:
    """Shares of one output token's time: the decode step's parts, plus the prefills that share its steps."""
    ctx = step_context(req.model, req.pool, replace(c.plan, replicas=1), c.engine, req.constants)
    parts = decode_breakdown(ctx, batch=c.pred.resident,
                             context=req.work.mean_context)
    named = {name: sum(parts[k] for k in keys) for name, keys in SHARES}
    if not c.disaggregated:  # a decode pass yields tokens_per_pass tokens (speculating), the rest is prefills'
        named["prefills sharing the steps"] = max(c.pred.tpot * tokens_per_pass(ctx) - c.pred.decode_step, 0.0)
    total = sum(named.values()) or 1.0
    return sorted(((k, v / total) for k, v in named.items() if v > 0), key=lambda kv: -kv[1])


def limits(req: ServeRequest, c: ServeCandidate) -> list[str]:
    """What caps the batch and what the first token waits for."""
    p = c.pred
    cap = {"load": "the load (every client's request is running)",
           "kv cache": f"the KV cache ({p.kv_capacity_tokens:,} tokens per replica)",
           "max_num_seqs": f"max_num_seqs = {c.engine.max_num_seqs}",
           "prefill pool": "the prefill pool's rate"}.get(p.limited_by, p.limited_by)
    out = [f"{p.resident} requests decode together per replica, held there by {cap}; "
           f"KV cache {100 * p.kv_occupancy:.0f} % used"]
    ttft = [("waiting", p.queue_wait), ("prefill", p.prefill), ("KV transfer", p.kv_transfer)]
    out.append("first token: " + ", ".join(f"{name} {1e3 * t:,.0f} ms" for name, t in ttft if t > 0))
    return out


def _loses(req: ServeRequest, best: ServeCandidate, c: ServeCandidate) -> str:
    if c.misses:
        return "misses " + "; ".join(c.misses)
    if req.objective == "latency":
        return f"{c.tails['e2e'] / best.tails['e2e'] - 1:+.0%} end-to-end latency"
    ratio = c.pred.tokens_per_s_per_gpu / best.pred.tokens_per_s_per_gpu - 1
    return f"{ratio:+.0%} tokens/s per GPU"


def runners_up(result: ServeResult, n: int = 4) -> list[tuple[str, str]]:
    """Why each of the next distinct layouts loses to the winner."""
    best = result.best or result.candidates[0]
    seen, out = {best.label()}, []
    for c in result.candidates:
        if c.label() in seen:
            continue
        seen.add(c.label())
        out.append((c.label(), _loses(result.request, best, c)))
        if len(out) == n:
            break
    return out


def _rel_miss(req: ServeRequest, c: ServeCandidate) -> float:
    """How far a candidate is from meeting every SLO (largest measured / target ratio)."""
    r = [c.tails["ttft"] / req.slo.ttft if req.slo.ttft else 0.0, c.tails["tpot"] / req.slo.tpot if req.slo.tpot
         else 0.0]
    if req.work.rate:
        r.append(req.work.rate / max(c.pred.requests_per_s, 1e-12))
    return max(r)


def nearest(result: ServeResult) -> list[str]:
    """When no deployment meets the SLOs: the closest one and the least change that would make one meet them."""
    req = result.request
    if not result.candidates:
        return _nothing_fits(req)
    close = min(result.candidates, key=lambda c: (_rel_miss(req, c), _score_key(c)))
    pct = f"p{round(100 * req.slo.percentile)}"
    out = [f"closest: {close.label()} ({'; '.join(close.misses)})",
           f"looser SLO: --ttft-ms {1e3 * close.tails['ttft']:,.0f} --tpot-ms {1e3 * close.tails['tpot']:,.1f} "
           f"(at {pct}) is met by {close.label()}"]
    if req.kv_dtype != "fp8":
        won = search(replace(req, kv_dtype="fp8")).best
        if won is not None:
            out.append(f"--kv-dtype fp8 meets the SLOs with {won.label()}")
    for k in MORE_GPUS:
        bigger = replace(req.pool, n_gpus=k * req.pool.n_gpus)
        won = search(replace(req, cluster=replace(req.cluster, pools=(bigger,), name=""))).best
        if won is not None:
            out.append(f"{bigger.n_gpus}x{bigger.gpu.name} meets the SLOs with {won.label()}")
            break
    load = _lower_load(req)
    if load:
        out.append(load)
    return out


def _nothing_fits(req: ServeRequest) -> list[str]:
    """No layout holds the weights and one request: the fewest GPUs (2x, 4x, 8x) and fp8 weights that would (as
    aggregated deployments, quicker to search, unless only disaggregated ones were asked for, which an aggregated
    one on these GPUs may then stand in for)."""
    out = []
    kind = "only" if req.disagg == "only" else "off"
    if kind == "only":
        won = search(replace(req, disagg="off")).candidates
        if won:
            out.append(f"--disagg off serves it on these GPUs, e.g. {won[0].label()}: a disaggregated deployment "
                       "needs a prefill replica and a decode replica of its own")
    for k in (2, 4, 8, 16):
        bigger = replace(req.pool, n_gpus=k * req.pool.n_gpus)
        won = search(replace(req, cluster=replace(req.cluster, pools=(bigger,), name=""), disagg=kind)).candidates
        if won:
            out.append(f"{bigger.n_gpus}x{bigger.gpu.name} holds it, e.g. {won[0].label()}")
            break
    if req.precision != "fp8":
        won = search(replace(req, precision="fp8", kv_dtype="fp8", disagg=kind)).candidates
        if won:
            out.append(f"--precision fp8 --kv-dtype fp8 holds it on these GPUs, e.g. {won[0].label()}")
    return out or ["no layout holds the weights and one request even on 16x the GPUs: a smaller model or GPUs "
                   "with more memory"]


def _score_key(c: ServeCandidate) -> float:
    return -c.pred.tokens_per_s_per_gpu


def _lower_load(req: ServeRequest) -> str:
    """The largest halving of the load under which some deployment meets the SLOs."""
    w = req.work
    for k in (2, 4, 8, 16, 32):
        if w.concurrency and w.concurrency // k >= 1:
            lighter = replace(w, concurrency=w.concurrency // k)
            flag = f"--concurrency {lighter.concurrency}"
        elif w.rate:
            lighter = replace(w, rate=w.rate / k)
            flag = f"--rate {lighter.rate:g}"
        else:
            return ""
        won = search(replace(req, work=lighter)).best
        if won is not None:
            return f"{flag} meets the SLOs with {won.label()}"
    return ""


GROUPED = 1.25
"""A benchmark TTFT this many times the steady state's is said to come from clients kept in step."""


def benchmark(req: ServeRequest, c: ServeCandidate) -> tuple[dict, str]:
    """What the exported benchmark (bench.sh: ``client_rounds`` requests per client, all clients starting at once)
    should report for an aggregated winner under a closed loop, replayed iteration by iteration, and a sentence
    saying so; ({}, "") otherwise. Clients that start together with fixed lengths stay in step: each group the token
    budget admits at once shares its prefill, which the steady state, whose arrivals are spread, does not see."""
    if c.disaggregated or not req.work.concurrency:
        return {}, ""
    ctx = step_context(req.model, req.pool, replace(c.plan, replicas=1), c.engine, req.constants)
    run = benchmark_run(ctx, req.work, replicas=c.plan.replicas)
    got = {"requests": run.requests * c.plan.replicas, "clients": req.work.concurrency,
           "ttft_ms": 1e3 * statistics.fmean(run.ttft), "tpot_ms": 1e3 * statistics.fmean(run.tpot or (0.0,)),
           "itl_ms": 1e3 * run.mean_itl, "output_tokens_per_s": run.output_tokens_per_s * c.plan.replicas}
    text = (f"the exported benchmark ({got['requests']:,} requests, {got['clients']} clients starting together) "
            f"should report mean TTFT {got['ttft_ms']:,.0f} ms, TPOT {got['tpot_ms']:,.1f} ms, "
            f"{got['output_tokens_per_s']:,.0f} output tokens/s (the run replayed step by step)")
    if got["ttft_ms"] > GROUPED * 1e3 * c.pred.ttft:
        admits = (f"each group its {step_budget(ctx):,}-token step budget admits at once sharing one prefill"
                  if c.engine.mixed_batches else "the engine prefilling every waiting prompt before it decodes again")
        text += (f"; its TTFT is above the steady state's {1e3 * c.pred.ttft:,.0f} ms because clients that start "
                 f"together stay in step, {admits}")
    return got, text


def capacity(req: ServeRequest, c: ServeCandidate) -> str:
    """For an aggregated winner under SLOs: the highest Poisson rate it holds within them at their percentile
    (``serve_capacity.sustainable_rate``), the load a user can promise, and which bound stops more."""
    if c.disaggregated or not (req.slo.ttft or req.slo.tpot):
        return ""
    ctx = step_context(req.model, req.pool, replace(c.plan, replicas=1), c.engine, req.constants)
    cap = sustainable_rate(ctx, req.work, replicas=c.plan.replicas, ttft=req.slo.ttft or UNBOUNDED,
                           tpot=req.slo.tpot or UNBOUNDED, q=req.slo.percentile, iterations=CAPACITY_STEPS)
    pct = f"p{round(100 * req.slo.percentile)}"
    if cap.prediction is None:
        return f"under Poisson arrivals no rate keeps its {pct} latencies within the SLOs"
    stop = {"ttft": f"TTFT {pct}", "tpot": f"TPOT {pct}", "saturation": "its throughput"}[cap.binding]
    return (f"under Poisson arrivals of these requests it holds up to {cap.rate:,.2f} requests/s "
            f"({cap.prediction.output_tokens_per_s:,.0f} output tokens/s) within the SLOs; {stop} stops more")


def speculation_gain(req: ServeRequest, c: ServeCandidate) -> str:
    """For an aggregated winner that speculates: its TPOT and throughput against the same deployment without the
    drafter at this load (where speculation stops paying, the sentence says so)."""
    sp = c.plan.speculation
    if sp is None or c.disaggregated:
        return ""
    plain = replace(c.plan, replicas=1, speculation=None)
    ctx = step_context(req.model, req.pool, plain, c.engine, req.constants)
    base = predict_load(ctx, req.work, replicas=c.plan.replicas)
    gain = c.pred.output_tokens_per_s / base.output_tokens_per_s - 1
    verdict = "" if c.pred.tpot < base.tpot else "; at this load it does not pay: the k + 1 rows a pass cost more "\
        "than the tokens it yields"
    drafts = f"{sp.draft_tokens} draft{'s' if sp.draft_tokens > 1 else ''}"
    return (f"speculation ({sp.method}, {drafts}, {sp.tokens_per_pass:.2f} tokens a pass): TPOT "
            f"{1e3 * c.pred.tpot:,.1f} ms against {1e3 * base.tpot:,.1f} ms without it, output tokens/s "
            f"{gain:+.0%}{verdict}")


UNBOUNDED = 1e9
"""A latency bound no deployment reaches (s): the SLO the user left unset."""
CAPACITY_STEPS = 10
"""Bisection steps of the stated rate: to 0.1 % of the offline throughput, which the two decimals printed show."""


def explain(result: ServeResult) -> Explanation:
    """The explanation of a search result."""
    req = result.request
    best = result.best
    if best is None:
        return Explanation(token_time=(), limits=(), runners_up=(), nearest=tuple(nearest(result)))
    bench, said = benchmark(req, best)
    more = tuple(s for s in (speculation_gain(req, best), said, capacity(req, best)) if s)
    return Explanation(token_time=tuple(token_time(req, best)), limits=tuple(limits(req, best)) + more,
                       runners_up=tuple(runners_up(result)), benchmark=bench)
