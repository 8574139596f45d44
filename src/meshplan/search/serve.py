"""The serving search: every deployment of a model on a cluster's GPUs (TP x PP x EP per replica, data-parallel
replicas, the engine's running-sequence cap, aggregated or disaggregated prefill/decode pools), each predicted by
the serving model, held against the SLOs at their percentile, and ranked by the objective.

Objectives: ``throughput`` (output tokens/s per GPU used), ``cost`` (tokens per dollar at ``price`` per
GPU-hour) and ``latency`` (lowest end-to-end latency at the SLO percentile). A deployment that cannot hold its
weights and one request is infeasible (with the reason); one that runs but misses an SLO is kept and marked, so
the nearest option can be named when nothing meets them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from meshplan.cost.result import pareto_front
from meshplan.cost.serve_disagg import predict_disagg
from meshplan.cost.serve_load import ServePrediction, fit_check, predict_load
from meshplan.cost.serve_sizing import sized_engine, with_cap
from meshplan.cost.serve_step import StepContext, step_context
from meshplan.cost.serve_tail import quantile
from meshplan.errors import SpecError
from meshplan.spec.cluster import ClusterSpec, Pool
from meshplan.spec.engine import EngineProfile
from meshplan.spec.model import ModelSpec
from meshplan.spec.serving import ServePlan, Workload

OBJECTIVES = ("throughput", "cost", "latency")
DISAGG = ("auto", "off", "only")
SEQ_CAPS = (256, 128, 64, 32)
"""Running-sequence caps tried below the engine's default (a lower cap trades TTFT for TPOT)."""


@dataclass(frozen=True, kw_only=True)
class Slo:
    """Latency targets (s; 0 = none) and the percentile they bind (0.5 = median)."""

    ttft: float = 0.0
    tpot: float = 0.0
    percentile: float = 0.9

    def __post_init__(self) -> None:
        for name in ("ttft", "tpot"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or v < 0 or v != v:
                raise SpecError(f"slo.{name}", v, "must be a time >= 0 (0 = no target)")
        if not 0 < self.percentile < 1:
            raise SpecError("slo.percentile", self.percentile, "must be between 0 and 1, e.g. 0.9 for p90")


MAX_SEQ_CAP = 65_536
"""Largest running-sequence cap a pin may ask for (engines ship 256 to 2,048)."""


@dataclass(frozen=True, kw_only=True)
class ServeRequest:
    """What to serve, where, under which load and targets, and what the user pinned (0 = searched)."""

    model: ModelSpec
    cluster: ClusterSpec
    engine: EngineProfile
    work: Workload
    slo: Slo = field(default_factory=Slo)
    objective: str = "throughput"
    precision: str = "bf16"
    kv_dtype: str = "bf16"
    tp: int = 0
    pp: int = 0
    ep: int = 0
    attn_dp: int = 0
    replicas: int = 0
    max_num_seqs: int = 0
    disagg: str = "auto"
    price: float = 0.0
    """Dollars per GPU-hour (``cost`` objective); 0 = the catalog's price of the GPU."""
    constants: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise SpecError("objective", self.objective, f"must be one of {', '.join(OBJECTIVES)}")
        if self.disagg not in DISAGG:
            raise SpecError("disagg", self.disagg, f"must be one of {', '.join(DISAGG)}")
        if self.engine.max_pp and self.pp > self.engine.max_pp:
            raise SpecError("--pp", self.pp, f"{self.engine.name} runs at most {self.engine.max_pp} pipeline "
                            f"stage(s); use --pp {self.engine.max_pp} or leave it unset, or an engine with pipeline "
                            "parallelism (vllm, sglang, trtllm)")
        if self.max_num_seqs and not self.engine.seq_cap_settable:
            raise SpecError("--max-num-seqs", self.max_num_seqs, f"{self.engine.name} takes no running-sequence cap "
                            f"({self.engine.sources.get('seq_cap_settable', 'seq_cap_settable = false')}); leave it "
                            "unset, or use an engine that takes one (tgi-2, vllm, sglang, trtllm)")
        if self.disagg == "only" and not self.engine.disaggregation:
            raise SpecError("--disagg", "only", f"{self.engine.name} serves prefill and decode in one engine (no "
                            "disaggregated deployment); use --disagg off, or an engine Dynamo runs (vllm, sglang, "
                            "trtllm)")
        longest = getattr(self.model, "max_seq_len", 0)
        if longest and self.work.longest > longest:
            raise SpecError("--input-len + --output-len", self.work.longest, f"exceeds {self.model.name}'s "
                            f"{longest:,} positions")
        if self.engine.max_context and self.work.longest > self.engine.max_context:
            raise SpecError("--input-len + --output-len", self.work.longest, f"exceeds the {self.engine.max_context:,} "
                            f"tokens one sequence of {self.engine.name} holds (max_context); shorten the requests "
                            "or use an engine that takes the model's context (vllm, sglang, trtllm)")
        if self.attn_dp > 1 and (self.model.decoder.moe is None or not self.engine.attention_dp):
            why = (f"{self.model.name} has no experts (dense): serve more replicas instead"
                   if self.model.decoder.moe is None else
                   f"{self.engine.name} runs no data-parallel attention (attention_dp = false); use sglang, vllm "
                   "or trtllm")
            raise SpecError("--attn-dp", self.attn_dp, why)
        node = min(self.cluster.pools[0].gpus_per_node, self.cluster.n_gpus)
        self._check_pins(node)
        self._check_ep(node)
        if self.attn_dp > 1 and max(self.tp, 1) * self.attn_dp > node:
            raise SpecError("--attn-dp", self.attn_dp, f"tp x attn_dp = {max(self.tp, 1)} x {self.attn_dp} must fit "
                            f"one node of {node} GPUs (the attention groups gather every layer's tokens over NVLink)")
        if not self.cluster.homogeneous:
            raise SpecError("gpus", self.cluster.describe(), "serving plans one GPU type; give one pool, e.g. "
                            f"{self.cluster.pools[0].n_gpus}x{self.cluster.pools[0].gpu.name}")

    def _check_pins(self, node: int) -> None:
        """A pinned tp, pp, attn_dp or sequence cap the search cannot try is refused, not "nothing fits"."""
        if self.tp and self.tp not in (opts := tp_options(self.model, self.pool, 0)):
            raise SpecError("--tp", self.tp, f"must be one of {', '.join(map(str, opts))} for {self.model.name} on "
                            f"{node}-GPU nodes: inside a node, dividing its attention heads, its KV heads dividing "
                            "tp or tp dividing them")
        if self.pp and self.pp not in (opts := pp_options(self.model, self.cluster.n_gpus, max(self.tp, 1), 0,
                                                          self.engine.max_pp)):
            raise SpecError("--pp", self.pp, f"must be one of {', '.join(map(str, opts)) or 'none'} here (powers "
                            "of two, at most the layers and the GPUs left by tp)")
        if self.attn_dp > 1 and self.attn_dp & (self.attn_dp - 1):
            raise SpecError("--attn-dp", self.attn_dp, "must be a power of two (2, 4, 8 attention groups)")
        if self.max_num_seqs > MAX_SEQ_CAP:
            raise SpecError("--max-num-seqs", self.max_num_seqs, f"must be at most {MAX_SEQ_CAP:,} (0 = the "
                            "profile's): every engine sizes its buffers by it")

    def _check_ep(self, node: int) -> None:
        """A pinned ep must be a layout the search has: whole experts over a group of GPUs that run them together
        (the TP group, or tp x attn_dp of them), dividing the experts; refused here rather than found empty."""
        moe = self.model.decoder.moe
        if self.ep <= 1 or moe is None:
            return
        if moe.n_experts % self.ep:
            raise SpecError("--ep", self.ep, f"must divide {self.model.name}'s {moe.n_experts} experts")
        group = self.tp * self.attn_dp if self.tp and self.attn_dp else 0
        if group and group % self.ep:
            raise SpecError("--ep", self.ep, f"must divide the tp x attn_dp = {group} GPUs that run the experts")
        if self.tp and (self.ep % self.tp or self.ep > node):
            raise SpecError("--ep", self.ep, f"must be a multiple of tp={self.tp} within one node of {node} GPUs "
                            "(experts inside the TP group, or over tp x attn_dp GPUs)")

    @property
    def pool(self) -> Pool:
        """The cluster's GPUs."""
        return self.cluster.pools[0]

    @property
    def dollars_per_gpu_hour(self) -> float:
        """The price the cost objective uses."""
        return self.price or self.pool.gpu.price_per_hour


@dataclass(frozen=True, kw_only=True)
class ServeCandidate:
    """One deployment and its prediction under the request's workload."""

    plan: ServePlan
    """Aggregated: the replicas' layout. Disaggregated: the decode pool (``replicas`` decode replicas)."""
    pred: ServePrediction
    prefill: ServePlan | None = None
    """Disaggregated: the prefill pool (``replicas`` prefill replicas)."""
    engine: EngineProfile
    tails: dict = field(default_factory=dict)
    """``ttft``, ``tpot``, ``itl``, ``e2e`` at the SLO percentile (s)."""
    misses: tuple[str, ...] = ()
    """One phrase per SLO missed."""
    seq_cap: int = 0
    """A running-sequence cap below the engine profile's that the search chose (0 = the profile's)."""

    @property
    def disaggregated(self) -> bool:
        return self.prefill is not None

    @property
    def meets(self) -> bool:
        return not self.misses

    @property
    def gpus(self) -> int:
        return self.pred.gpus

    def label(self) -> str:
        """Short layout name: replicas x layout, e.g. ``2xtp4``, or ``P1xtp4+D1xtp4`` for a prefill and a decode
        pool."""
        cap = f" seqs<={self.seq_cap}" if self.seq_cap else ""
        if self.prefill is not None:
            return f"P{_layout(self.prefill)}+D{_layout(self.plan)}{cap}"
        return _layout(self.plan) + cap


def _layout(p: ServePlan) -> str:
    par = "".join(f"{k}{v}" for k, v in (("tp", p.tp), ("adp", p.attn_dp), ("pp", p.pp), ("ep", p.ep))
                  if v > 1 or k == "tp")
    return f"{p.replicas}x{par}"


@dataclass(frozen=True, kw_only=True)
class ServeResult:
    """Every evaluated deployment, best first (those meeting the SLOs ahead of those that miss)."""

    request: ServeRequest
    candidates: tuple[ServeCandidate, ...]
    infeasible: tuple[tuple[str, str], ...]
    """(layout, reason) of layouts that cannot run at all."""

    @property
    def meeting(self) -> list[ServeCandidate]:
        return [c for c in self.candidates if c.meets]

    @property
    def best(self) -> ServeCandidate | None:
        m = self.meeting
        return m[0] if m else None

    def pareto(self) -> list[ServeCandidate]:
        """Deployments no other beats on both tokens/s per GPU and tokens/s per user (1 / TPOT at the
        percentile), among those meeting the SLOs (all when none does), most throughput first."""
        pool = self.meeting or list(self.candidates)
        idx = pareto_front([(-c.pred.tokens_per_s_per_gpu, c.tails["tpot"]) for c in pool])
        return [pool[i] for i in idx]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def tp_options(model: ModelSpec, pool: Pool, pinned: int) -> list[int]:
    """TP degrees an engine accepts: inside one node, dividing the attention heads, and the KV heads dividing
    tp or tp dividing them (vLLM ``verify_with_parallel_config``; replicated KV heads beyond n_kv)."""
    att = model.decoder.attention
    out = []
    for tp in _divisors(min(pool.gpus_per_node, pool.n_gpus)):
        if att is not None and att.n_heads % tp:
            continue
        if att is not None and att.kind != "mla" and att.n_kv_heads % tp and tp % att.n_kv_heads:
            continue
        out.append(tp)
    return [t for t in out if t == pinned] if pinned else out


def pp_options(model: ModelSpec, n_gpus: int, tp: int, pinned: int, most: int = 0) -> list[int]:
    """Pipeline stages: powers of two up to the GPUs left by tp, the layer count and the engine's ``most``
    (``EngineProfile.max_pp``, 0 = any)."""
    n_layers = sum(1 for _ in model.layers())
    opts = [p for p in (1, 2, 4, 8, 16) if p * tp <= n_gpus and p <= n_layers and (not most or p <= most)]
    return [p for p in opts if p == pinned] if pinned else opts


def ep_options(model: ModelSpec, tp: int, pinned: int) -> list[int]:
    """Expert parallelism inside a group of ``tp`` GPUs that run the experts together (1, or every rank whole
    experts when they divide)."""
    moe = model.decoder.moe
    opts = [1] if moe is None else sorted({1, tp} if moe.n_experts % tp == 0 else {1})
    return [e for e in opts if e == pinned] if pinned else opts


def group_options(req: ServeRequest, tp: int, pp: int) -> list[tuple[int, int]]:
    """(attn_dp, ep) of a replica of ``tp`` x ``pp``: attention over the TP group with its experts inside it, or,
    for a MoE model on an engine that runs it (``EngineProfile.attention_dp``), attention data-parallel over
    2, 4, ... groups of tp inside one node, the experts over all of them (pinned values only, when given)."""
    out = [(1, ep) for ep in ep_options(req.model, tp, req.ep)] if req.attn_dp <= 1 else []
    most = req.engine.attention_dp_tp
    if req.model.decoder.moe is None or not req.engine.attention_dp or pp > 1 or (most and tp > most):
        return out
    d = 2
    while tp * d <= min(req.pool.gpus_per_node, req.pool.n_gpus):
        if not req.attn_dp or d == req.attn_dp:
            out += [(d, ep) for ep in ep_options(req.model, tp * d, req.ep)]
        d *= 2
    return out


def engine_options(req: ServeRequest) -> list[EngineProfile]:
    """The engine as profiled, and with lower running-sequence caps (a pinned cap is the only one)."""
    if req.max_num_seqs:
        return [replace(req.engine, max_num_seqs=req.max_num_seqs)]
    if not req.engine.seq_cap_settable:
        return [req.engine]
    caps = [c for c in SEQ_CAPS if c < req.engine.max_num_seqs]
    if req.work.concurrency:
        caps = [c for c in caps if c < req.work.concurrency]  # a cap above the load changes nothing
    return [req.engine, *(replace(req.engine, max_num_seqs=c) for c in caps)]


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


def _contexts(req: ServeRequest, engine: EngineProfile, *, tp: int, pp: int, ep: int,
              attn_dp: int = 1) -> tuple[ServePlan, StepContext]:
    plan = ServePlan(tp=tp, pp=pp, ep=ep, attn_dp=attn_dp, precision=req.precision, kv_dtype=req.kv_dtype,
                     engine=req.engine.name)
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
    for tp in tp_options(req.model, req.pool, req.tp):
        for pp in pp_options(req.model, req.pool.n_gpus, tp, req.pp, req.engine.max_pp):
            for adp, ep in group_options(req, tp, pp):
                for engine in engine_options(req):
                    plan, ctx = _contexts(req, engine, tp=tp, pp=pp, ep=ep, attn_dp=adp)
                    why = fit_check(ctx, req.work)
                    if why is not None:
                        if engine is req.engine or req.max_num_seqs:
                            bad.append((_layout(plan), why.reason))
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
    tps = tp_options(req.model, req.pool, req.tp)
    for engine in engine_options(req):
        ctxs = {}
        for tp in tps:
            for adp, ep in group_options(req, tp, 1):
                plan, ctx = _contexts(req, engine, tp=tp, pp=1, ep=ep, attn_dp=adp)
                if fit_check(ctx, req.work) is None:
                    ctxs[(tp, adp, ep)] = (plan, ctx)
        for (pplan, pctx) in ctxs.values():
            for (dplan, dctx) in ctxs.values():
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
