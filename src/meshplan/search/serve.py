"""The serving search: every deployment of a model on a cluster's GPUs (TP x PP x EP per replica, data-parallel
replicas, the engine's running-sequence cap, aggregated or disaggregated prefill/decode pools), each predicted by
the serving model, held against the SLOs at their percentile, and ranked by the objective.

Objectives: ``throughput`` (output tokens/s per GPU used), ``cost`` (tokens per dollar at ``price`` per
GPU-hour) and ``latency`` (lowest end-to-end latency at the SLO percentile). A deployment that cannot hold its
weights and one request is infeasible (with the reason); one that runs but misses an SLO is kept and marked, so
the nearest option can be named when nothing meets them.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from meshplan.cost.serve_disagg import predict_disagg
from meshplan.cost.serve_load import ServePrediction, fit_check, predict_load
from meshplan.cost.serve_sizing import sized_engine, with_cap
from meshplan.cost.serve_step import StepContext, step_context
from meshplan.cost.serve_tail import quantile
from meshplan.search.serve_request import ServeCandidate, ServeRequest, ServeResult, layout_name
from meshplan.search.serve_space import engine_options, group_options, pp_options, serve_tps
from meshplan.spec.engine import EngineProfile
from meshplan.spec.serving import ServePlan
from meshplan.spec.speculation import Speculation


def _score(req: ServeRequest, c: ServeCandidate) -> float:
    """Smaller is better."""
    if req.objective == "latency":
        return c.tails["e2e"]
    return -c.pred.tokens_per_s_per_gpu  # cost: same order at one price per GPU-hour


def _judge(req: ServeRequest, plan: ServePlan, pred: ServePrediction, engine: EngineProfile,
           prefill: ServePlan | None = None, *, variant: EngineProfile | None = None) -> ServeCandidate:
    """``engine``: as the candidate runs it (sized for the workload); ``variant``: the cap the search tried."""
    q = req.slo.percentile
    tails = {m: quantile(pred, m, q) for m in ("ttft", "tpot", "itl", "e2e")}
    pct = f"p{round(100 * q)}"
    misses = []
    if req.slo.ttft and tails["ttft"] > req.slo.ttft:
        misses.append(f"TTFT {pct} {1e3 * tails['ttft']:,.0f} ms > {1e3 * req.slo.ttft:,.0f} ms")
    if req.slo.tpot and tails["tpot"] > req.slo.tpot:
        misses.append(f"TPOT {pct} {1e3 * tails['tpot']:,.1f} ms > {1e3 * req.slo.tpot:,.1f} ms")
    if req.work.rate and pred.requests_per_s < 0.99 * req.work.rate:
        misses.append(f"sustains {pred.requests_per_s:.2f} req/s < offered {req.work.rate:g}")
    tried = variant or engine
    cap = tried.max_num_seqs if tried.max_num_seqs != req.engine.max_num_seqs else 0
    return ServeCandidate(plan=plan, pred=pred, prefill=prefill, engine=engine, tails=tails, misses=tuple(misses),
                          seq_cap=cap)


def _replica_counts(req: ServeRequest, per_replica: int) -> list[int]:
    most = req.pool.n_gpus // per_replica
    if req.work.concurrency:
        most = min(most, req.work.concurrency)
    if req.replicas:
        return [req.replicas] if req.replicas <= req.pool.n_gpus // per_replica else []
    return list(range(1, most + 1))


def spec_options(req: ServeRequest) -> list[Speculation | None]:
    """The speculation each deployment runs: the request's, at every draft length it leaves to the search."""
    sp = req.speculation
    if sp is None or not req.draft_options:
        return [sp]
    return [replace(sp, draft_tokens=k) for k in req.draft_options]


def _contexts(req: ServeRequest, engine: EngineProfile, *, tp: int, pp: int, ep: int, attn_dp: int = 1,
              spec: Speculation | None = None) -> tuple[ServePlan, StepContext]:
    plan = ServePlan(tp=tp, pp=pp, ep=ep, attn_dp=attn_dp, precision=req.precision, kv_dtype=req.kv_dtype,
                     engine=req.engine.name, speculation=spec)
    # The engine as its benchmark builds it for this layout and workload; a cap the user pinned stays as pinned,
    # one the search tries applies below the sized one.
    sized = sized_engine(req.engine, req.model, plan, req.pool, req.work)
    if engine is not req.engine:
        seqs = engine.max_num_seqs if req.max_num_seqs else min(engine.max_num_seqs, sized.max_num_seqs)
        sized = with_cap(sized, seqs)
    return plan, step_context(req.model, req.pool, plan, sized, req.constants)


def aggregated(req: ServeRequest) -> tuple[list[ServeCandidate], list[tuple[str, str]]]:
    """Every aggregated deployment: replicas of one tp x pp (x ep) layout, each at every engine cap."""
    out, bad = [], []
    for tp in serve_tps(req):
        for pp in pp_options(req.model, req.pool.n_gpus, tp, req.pp, 1 if req.speculation else req.engine.max_pp):
            for (adp, ep), sp in itertools.product(group_options(req, tp, pp), spec_options(req)):
                for engine in engine_options(req):
                    plan, ctx = _contexts(req, engine, tp=tp, pp=pp, ep=ep, attn_dp=adp, spec=sp)
                    why = fit_check(ctx, req.work)
                    if why is not None:
                        if engine is req.engine or req.max_num_seqs:
                            bad.append((layout_name(plan), why.reason))
                        break
                    for n in _replica_counts(req, plan.gpus_per_replica):
                        pred = predict_load(ctx, req.work, replicas=n)
                        out.append(_judge(req, replace(plan, replicas=n), pred, ctx.engine, variant=engine))
    return out, bad


def disaggregated(req: ServeRequest) -> list[ServeCandidate]:
    """Every split of the GPUs into a prefill pool and a decode pool (one node-local layout each, the decode
    pool taking every GPU the prefill pool leaves)."""
    if req.pp > 1 or req.replicas or req.pool.n_gpus < 2:
        return []
    n = req.pool.n_gpus
    out = []
    tps = serve_tps(req)
    for engine in engine_options(req):
        ctxs: dict[Speculation | None, list] = {}  # the decode pools, at each draft length; prefill, the request's
        for tp in tps:
            for (adp, ep), sp in itertools.product(group_options(req, tp, 1), spec_options(req)):
                plan, ctx = _contexts(req, engine, tp=tp, pp=1, ep=ep, attn_dp=adp, spec=sp)
                if fit_check(ctx, req.work) is None:
                    ctxs.setdefault(sp, []).append((plan, ctx))
        prefills = ctxs.get(spec_options(req)[0], [])
        for (pplan, pctx) in prefills:
            for (dplan, dctx) in (pair for pools in ctxs.values() for pair in pools):
                for n_p in range(1, n // pplan.gpus_per_replica):
                    n_d = (n - n_p * pplan.gpus_per_replica) // dplan.gpus_per_replica
                    if n_d < 1:
                        break
                    pred = predict_disagg(pctx, dctx, req.work, n_prefill=n_p, n_decode=n_d)
                    out.append(_judge(req, replace(dplan, replicas=n_d), pred, dctx.engine,
                                      prefill=replace(pplan, replicas=n_p), variant=engine))
    return out


def search(req: ServeRequest) -> ServeResult:
    """Evaluate every deployment the request allows and rank them."""
    cands, bad = ([], []) if req.disagg == "only" else aggregated(req)
    if req.disagg != "off" and req.engine.disaggregation:
        cands += disaggregated(req)
    # Equal scores (independent replicas under an offline load give the same tokens/s per GPU): more total
    # throughput first, then fewer GPUs.
    cands.sort(key=lambda c: (not c.meets, float(f"{_score(req, c):.4g}"), -c.pred.output_tokens_per_s, c.gpus,
                              c.tails["e2e"]))
    return ServeResult(request=req, candidates=tuple(_distinct(cands)), infeasible=tuple(bad))


def _distinct(cands: list[ServeCandidate]) -> list[ServeCandidate]:
    """Drop a lower running-sequence cap that changes nothing (the batch never reaches it): the first of equal
    predictions is kept, which is the engine as profiled (evaluated first, stable sort)."""
    seen, out = set(), []
    for c in cands:
        key = (c.prefill, c.plan, tuple(round(v, 9) for v in c.tails.values()), round(c.pred.output_tokens_per_s, 6))
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out
