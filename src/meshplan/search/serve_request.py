"""What a serving search is asked (``ServeRequest``: model, cluster, engine, workload, SLOs, objective and the
user's pins, each checked up front) and what it answers (``ServeCandidate``, ``ServeResult``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from meshplan import catalog
from meshplan.cost.memory import model_params
from meshplan.cost.result import pareto_front
from meshplan.cost.serve_load import ServePrediction
from meshplan.errors import SpecError
from meshplan.search.serve_space import pp_options, tp_options
from meshplan.spec.cluster import ClusterSpec, Pool
from meshplan.spec.engine import EngineProfile
from meshplan.spec.model import ModelSpec
from meshplan.spec.serving import ServePlan, Workload
from meshplan.spec.speculation import MAX_DRAFT_TOKENS, Speculation

OBJECTIVES = ("throughput", "cost", "latency")
DISAGG = ("auto", "off", "only")


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
    speculation: Speculation | None = None
    """Speculative decoding every deployment runs (pinned: its acceptance is the user's data), or none."""
    draft_options: tuple[int, ...] = ()
    """Draft lengths the search tries with ``speculation``'s acceptance (empty: its own ``draft_tokens``)."""
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
        check_speculation(self.speculation, self.model, self.engine, pp=self.pp, attn_dp=self.attn_dp)
        if self.draft_options and (self.speculation is None or not all(
                isinstance(k, int) and 1 <= k <= MAX_DRAFT_TOKENS for k in self.draft_options)):
            raise SpecError("draft_options", self.draft_options, f"need speculation, and draft lengths from 1 to "
                            f"{MAX_DRAFT_TOKENS}")
        if self.speculation is not None and self.speculation.draft is not None and self.tp:
            opts = tp_options(self.speculation.draft, self.pool, 0)
            if self.tp not in opts:
                raise SpecError("--tp", self.tp, f"the draft model {self.speculation.draft.name} runs at the same tp, "
                                f"which must be one of {', '.join(map(str, opts))} for its heads")
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


MTP_FAMILIES = ("deepseek_v3",)
"""Model families whose checkpoints ship multi-token-prediction modules (DeepSeek-V3/R1 config.json
num_nextn_predict_layers 1; vLLM deepseek_mtp, SGLang NEXTN, TensorRT-LLM MTP); a checkpoint of the family
without them (Kimi-K2: 0) is the user's to know."""


def check_speculation(spec: Speculation | None, model: ModelSpec, engine: EngineProfile, *, pp: int = 0,
                      attn_dp: int = 0) -> None:
    """Speculation a deployment can run: a drafter the engine has (with data-parallel attention where pinned), on
    one pipeline stage, an MTP module the model ships, a draft model of the same vocabulary and smaller."""
    if spec is None:
        return
    if spec.method not in engine.speculative:
        runs = ", ".join(engine.speculative) or "no speculative decoding"
        with_it = [e for e in ("vllm", "sglang", "trtllm") if spec.method in catalog.engine(e).speculative]
        raise SpecError("--speculative", spec.method, f"{engine.name} runs {runs} "
                        f"({engine.sources.get('speculative', 'none read from its code')}); use "
                        f"{', '.join(with_it) or 'another drafter'}")
    if pp > 1:
        raise SpecError("--pp", pp, "speculative decoding is planned on one pipeline stage; leave --pp unset")
    if attn_dp > 1 and spec.method in engine.speculative_no_adp:
        raise SpecError("--attn-dp", attn_dp, f"{engine.name} runs {spec.method} speculation without data-parallel "
                        f"attention ({engine.sources.get('speculative_no_adp', '')}); leave --attn-dp unset")
    if spec.method == "mtp" and model.family not in MTP_FAMILIES:
        raise SpecError("--speculative", "mtp", f"{model.name} ({model.family}) ships no multi-token-prediction "
                        f"module (families with one: {', '.join(MTP_FAMILIES)}); use eagle with an EAGLE head, "
                        "ngram, or a draft model")
    if spec.draft is not None and spec.draft.vocab != model.vocab:
        raise SpecError("--draft-model", spec.draft.name, f"has a vocabulary of {spec.draft.vocab:,} tokens, "
                        f"{model.name} {model.vocab:,}: a draft model must share the target's tokenizer")
    if spec.draft is not None and model_params(spec.draft) >= model_params(model):
        raise SpecError("--draft-model", spec.draft.name, f"has {model_params(spec.draft) / 1e9:,.1f}B parameters, "
                        f"no fewer than {model.name}'s {model_params(model) / 1e9:,.1f}B: a draft model is a smaller "
                        "one that decodes k tokens for less than the target's one pass")


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
        sp = self.plan.speculation
        cap += f" k{sp.draft_tokens}" if sp is not None else ""
        if self.prefill is not None:
            return f"P{layout_name(self.prefill)}+D{layout_name(self.plan)}{cap}"
        return layout_name(self.plan) + cap


def layout_name(p: ServePlan) -> str:
    """Replicas x parallel degrees of one pool, e.g. ``2xtp4``, ``1xtp2adp4ep8``."""
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
