"""The request layer of a serving prediction: continuous batching with KV-limited admission, in steady state,
under a closed loop (concurrency), an open loop (Poisson rate) or offline (everything queued at once).

Per replica, R requests are resident: as many as the load offers, capped by the engine's ``max_num_seqs`` and by
the KV cache (``admission``: ``reserve`` holds room for the whole output, ``lazy`` takes blocks as sequences grow,
so on average half the output). In one cycle every resident request decodes ``O`` tokens and each is replaced by
a new one whose prefill takes a step of its own, so the cycle is ``O t_d(R) + R t_p`` and a request's token time
``t_d + (R - 1) t_p / O`` (Orca/vLLM iteration-level scheduling). Waiting beyond the resident set follows from
Little's law in a closed loop, and from Kingman's G/G/1 approximation (Kingman 1961) in an open loop. A
concurrency the cache cannot hold is queued, never "out of memory": only weights plus one request that do not fit
are infeasible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from meshplan.cost.serve_chunked import chunked_state, prompt_firsts
from meshplan.cost.serve_memory import kv_bytes_per_token_per_gpu, kv_capacity_bytes, weight_bytes_per_gpu
from meshplan.cost.serve_spec import tokens_per_pass
from meshplan.cost.serve_step import StepContext, decode_time, prefill_time, seq_cap, step_budget
from meshplan.cost.serve_wander import Wander, wander
from meshplan.errors import Infeasible
from meshplan.spec.hardware import GiB
from meshplan.spec.serving import Workload


@dataclass(frozen=True, kw_only=True)
class ServePrediction:
    """Predicted steady state of a deployment under one workload (times in seconds, per request unless said)."""

    ttft: float
    """Time to first token: queue wait plus the prefill."""
    tpot: float
    """Time per output token after the first ((E2E - TTFT) / (output - 1))."""
    itl: float
    """Gap between streamed chunks (a multi-step engine streams several tokens per chunk, a speculating one the
    tokens each pass accepts)."""
    e2e: float
    """End-to-end latency of a request."""
    queue_wait: float
    """Part of TTFT spent waiting for admission (KV room, sequence slots) or behind other requests."""
    output_tokens_per_s: float
    """Generated tokens per second of the whole deployment."""
    requests_per_s: float
    """Completed requests per second of the whole deployment."""
    prompt_tokens_per_s: float = 0.0
    """Prompt tokens per second the deployment takes in (requests/s x the mean prompt)."""
    resident: int
    """Requests decoding together on one replica."""
    kv_capacity_tokens: int
    """KV tokens one replica holds."""
    kv_occupancy: float
    """Share of the KV cache the resident requests use."""
    limited_by: str
    """What caps the resident batch: ``load``, ``kv cache`` or ``max_num_seqs``."""
    decode_step: float
    """One decode step at the resident batch."""
    prefill: float
    """One prompt's prefill."""
    wait_fixed: float = 0.0
    """Part of ``queue_wait`` every request pays (a closed loop's admission wait: clients cycle in turn)."""
    wait_prob: float = 0.0
    """Probability that a request waits beyond ``wait_fixed`` (the busy share of what it queues for)."""
    stall: float = 0.0
    """Extra time of a decode step that carries a prefill (or a prefill chunk)."""
    stall_share: float = 0.0
    """Share of decode steps that carry one."""
    tpot_spread: tuple[tuple[float, float], ...] = ()
    """(standard deviation of one request's TPOT, probability) per output length: under Poisson arrivals the
    prompt tokens joining each decode step vary, and a request averages that over its own output (empty =
    every request's TPOT is the mean)."""
    prefill_spread: tuple[tuple[float, float], ...] = ()
    """(seconds from the mean prefill to this prompt length's, probability) per prompt length: a longer prompt
    takes longer to its first token (empty = fixed prompts)."""
    step_sd: float = 0.0
    """Standard deviation of one engine step under Poisson arrivals (the prompt tokens it carries vary); the step
    a prompt joins varies so too (0 = steps are all alike)."""
    tokens_per_pass: float = 1.0
    """Tokens a decode pass yields a sequence (a speculating engine's mean acceptance length; ``decode_step``,
    ``stall`` and ``residual_span`` are per pass, ``tpot`` per token)."""
    residual_span: float = 0.0
    """Span of the step (or multi-step round) an arrival finds under way, whose uniform remainder it waits (its
    mean, half the span, is in ``ttft``)."""
    decode_spread: tuple[tuple[float, float], ...] = ()
    """(seconds from the mean decode phase to this output length's, probability) per output length: E2E grows
    with the tokens a request generates (empty = fixed outputs)."""
    kv_transfer: float = 0.0
    """Prefill-to-decode KV-cache transfer of one request (disaggregated serving)."""
    gpus: int = 0
    """GPUs the deployment uses."""

    @property
    def tokens_per_s_per_gpu(self) -> float:
        """Output tokens per second per GPU used."""
        return self.output_tokens_per_s / max(self.gpus, 1)

    @property
    def queue_dominated(self) -> bool:
        """Most of TTFT is waiting, not prefill."""
        return self.queue_wait > 0.5 * self.ttft

    def metric(self, name: str) -> float:
        """A validation metric by its CSV name (``ttft_ms``, ``tpot_ms``, ``itl_ms``, ``e2e_latency_s``,
        ``output_tokens_per_s``, ``total_tokens_per_s`` (prompt and output tokens, as trtllm-bench's "Total Token
        Throughput"), ``requests_per_s``, ``tokens_per_s_per_gpu`` (output tokens per GPU, its "Per GPU Output
        Throughput"))."""
        return {"ttft_ms": 1e3 * self.ttft, "tpot_ms": 1e3 * self.tpot, "itl_ms": 1e3 * self.itl,
                "e2e_latency_s": self.e2e, "output_tokens_per_s": self.output_tokens_per_s,
                "total_tokens_per_s": self.output_tokens_per_s + self.prompt_tokens_per_s,
                "requests_per_s": self.requests_per_s, "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu}[name]


def kv_capacity_tokens(ctx: StepContext) -> int:
    """KV tokens one replica holds, in whole blocks (every attention data-parallel group its own cache)."""
    per_token = kv_bytes_per_token_per_gpu(ctx.model, ctx.plan)
    cap = kv_capacity_bytes(ctx.model, ctx.pool, ctx.plan, ctx.engine)
    tokens = int(cap // per_token) if per_token else 0
    return (tokens - tokens % ctx.engine.block_size) * ctx.plan.attn_dp



def fit_check(ctx: StepContext, work: Workload) -> Infeasible | None:
    """Infeasible when the weights leave no KV room for even one request (the only "out of memory")."""
    cap = kv_capacity_tokens(ctx)
    need = work.longest
    if cap >= need:
        return None
    where = f"{ctx.model.name} tp={ctx.plan.tp} pp={ctx.plan.pp} on {ctx.pool.gpu.name}"
    weights = weight_bytes_per_gpu(ctx.model, ctx.plan) / GiB
    if cap <= 0:
        reason = (f"{where}: {weights:,.1f} GiB of {ctx.plan.precision} weights per GPU leave no KV cache in "
                  f"{ctx.pool.gpu.hbm_bytes / GiB:,.0f} GiB ({ctx.engine.name} sizes it at "
                  f"{ctx.engine.kv_memory_fraction:g} of {ctx.engine.kv_fraction_of} memory)")
    else:
        reason = f"{where}: the KV cache holds {cap:,} tokens after the weights, one request needs {need:,}"
    return Infeasible(kind="memory", reason=reason, details={"kv_capacity_tokens": cap, "request_tokens": need,
                                                             "weight_gib_per_gpu": weights})


def kv_need(ctx: StepContext, work: Workload) -> float:
    """KV tokens a resident request holds on average for admission (whole output when reserved, half as it
    grows when blocks are taken lazily; outputs length-biased), rounded up to blocks."""
    out = work.resident_output if ctx.engine.admission == "reserve" else work.resident_output / 2.0
    tokens = work.mean_context - work.resident_output / 2.0 + out
    b = ctx.engine.block_size
    return -(-tokens // b) * b


def resident_cap(ctx: StepContext, work: Workload) -> tuple[int, str]:
    """Most requests one replica runs at once, and what sets it."""
    by_kv = max(int(kv_capacity_tokens(ctx) // kv_need(ctx, work)), 1)
    if by_kv < seq_cap(ctx):
        return by_kv, "kv cache"
    return seq_cap(ctx), "max_num_seqs"


def prompts_per_step(ctx: StepContext, work: Workload, resident: int) -> int:
    """Prompts one prefill step carries in steady state: the arrivals per decode step, R / O (each cycle of O
    steps replaces R requests), as many as the step's token budget holds (vLLM, SGLang and TRT-LLM schedule
    every waiting prompt that fits ``max_batched_tokens``), at least one."""
    fit = max(step_budget(ctx) // max(work.input_len, 1), 1)
    return int(max(1, min(round(resident * tokens_per_pass(ctx) / work.output_len), fit)))


def steady_state(ctx: StepContext, work: Workload, resident: int) -> tuple[float, float, float, float]:
    """(decode step, prefill step, cycle, token time) with ``resident`` requests on one replica: each prompt
    costs its share of a prefill step of ``prompts_per_step`` prompts; an engine that prefills in chunks beside
    the decodes runs mixed iterations instead (``serve_chunked``), so the prefill's time is what one prompt's
    iterations take to its first token."""
    if ctx.engine.mixed_batches:
        return _chunked_steady(chunked_state(ctx, work, resident), work, resident)
    k = prompts_per_step(ctx, work, resident)
    t_p = mean_prefill(ctx, work, prompts=k)
    t_d = decode_time(ctx, batch=resident, context=work.mean_context)
    per_token = t_d / tokens_per_pass(ctx)  # a speculating pass yields its mean acceptance length
    cycle = work.output_len * per_token + resident * t_p / k
    tpot = per_token + (resident - 1) * t_p / k / work.output_len
    return t_d, t_p, cycle, tpot


def _chunked_steady(st, work: Workload, resident: int) -> tuple[float, float, float, float]:
    """``steady_state``'s four figures from a chunked steady state: the resident set cycles at the pace of its
    decoding part; a decoding request's tokens wait on the chunks of the other requests' prompts, not on its own,
    which was prefilled before it decodes (``others``; as ``steady_state``'s (R - 1) prompts per cycle)."""
    cycle = resident * work.output_len * st.iteration / (st.decoding * st.tokens_per_pass)
    # When the budget decodes fewer than the resident set an iteration, each waits R / n_d iterations a pass
    share = max(resident / st.decoding, 1.0)
    return (st.t_decode, st.first, cycle,
            (st.t_decode + others(resident) * (st.iteration - st.t_decode)) * share / st.tokens_per_pass)


def others(resident: int) -> float:
    """Share of a cycle's prompts that are not the decoding request's own: (R - 1) / R of the R prefilled."""
    return (resident - 1) / resident if resident > 1 else 0.0


def resident_under_load(ctx: StepContext, work: Workload, replicas: int, open_loop) -> tuple[int, int, str]:
    """(resident requests per replica, the cap, what sets it) for decode ``replicas``: offline fills the cap, a
    closed loop spreads its clients, an open loop takes ``open_loop(ctx, work, cap, replicas)``'s fixed point."""
    cap, limit = resident_cap(ctx, work)
    if work.offline:
        return cap, cap, limit
    if work.concurrency:
        per = -(-work.concurrency // replicas)
        return (per, cap, "load") if per <= cap else (cap, cap, limit)
    resident, limit = open_loop(ctx, work, cap, replicas)
    return resident, cap, limit


def predict_load(ctx: StepContext, work: Workload, replicas: int = 1) -> ServePrediction:
    """The steady state of ``replicas`` identical replicas sharing the workload evenly."""
    resident, cap, limit = resident_under_load(ctx, work, replicas, _open_loop_resident)
    if ctx.engine.mixed_batches:  # one mixed steady state serves the step, the stall and the wait
        st = chunked_state(ctx, work, resident)
        t_d, t_p, cycle, tpot = _chunked_steady(st, work, resident)
        # A queue of waiting prompts drains ``st.prompts`` per iteration: every one that fits the room joins it
        k, (stall, share) = st.prompts, (st.t_mixed - st.t_decode, st.share * others(resident))
        firsts = prompt_firsts(ctx, work, st) if len(work.bins("input")) > 1 else ()
    else:
        t_d, t_p, cycle, tpot = steady_state(ctx, work, resident)
        k = prompts_per_step(ctx, work, resident)
        stall, share = prefill_stall(ctx, work, resident=resident, t_p=t_p, k=k)
        # The step carries k prompts, this one among them: its length moves the step by a k-th of what k prompts
        # of that length would
        firsts = tuple((prefill_time(ctx, tokens=n, prompts=k) / k, p) for n, p in work.bins("input"))
    x_req = resident / cycle  # requests/s of one replica
    if work.rate and resident < cap:  # an open loop below the cap serves what arrives (Little's R is rounded)
        x_req = min(x_req, work.rate / replicas) if resident == 1 else work.rate / replicas
    service = t_p + t_d / 2 + (work.output_len - 1) * tpot
    wait, fixed, prob = _wait(ctx, work, replicas, resident=resident, cap=cap, x_req=x_req, service=service,
                              t_p=t_p, k=k)
    # Multi-step scheduling admits prompts only between rounds of ``multi_step`` decode steps: an arrival waits
    # half a round beyond the step it lands in (vllm@v0.6.0 multi-step scheduler, RFC vllm#6854)
    rounds = 0.0 if work.offline else (ctx.engine.multi_step - 1) * t_d / 2
    # A step lasts a pass (tau tokens); a request's TPOT averages (O - 1) / tau passes' noise, tau tokens each
    tau = tokens_per_pass(ctx)
    noise = step_sd(ctx, work, x_req=x_req, gap=tau * tpot) if work.rate else 0.0
    batch = wander(ctx, work, steady_state, resident=resident, cap=cap, rate=work.rate / replicas)
    ttft = wait + rounds + t_p + t_d / 2 + ctx.request_s
    return ServePrediction(
        ttft=ttft, tpot=tpot, itl=ctx.engine.multi_step * tokens_per_pass(ctx) * tpot,
        tokens_per_pass=tokens_per_pass(ctx), e2e=ttft + (work.output_len - 1) * tpot,
        queue_wait=wait, output_tokens_per_s=replicas * x_req * work.output_len, requests_per_s=replicas * x_req,
        prompt_tokens_per_s=replicas * x_req * work.input_len,
        resident=resident, kv_capacity_tokens=kv_capacity_tokens(ctx),
        kv_occupancy=min(resident * kv_need(ctx, work) / max(kv_capacity_tokens(ctx), 1), 1.0), limited_by=limit,
        decode_step=t_d, prefill=t_p, wait_fixed=fixed, wait_prob=prob, stall=stall, stall_share=share,
        tpot_spread=tpot_spread(work, noise / math.sqrt(tau), batch, tpot), step_sd=noise,
        prefill_spread=about_mean(firsts), decode_spread=decode_spread(work, tpot), residual_span=2 * rounds + t_d,
        gpus=replicas * ctx.plan.gpus_per_replica)


def about_mean(values: tuple[tuple[float, float], ...]) -> tuple[tuple[float, float], ...]:
    """(value - the weighted mean, probability) of (value, probability) pairs; empty for a single value."""
    if len(values) < 2:
        return ()
    mean = sum(v * p for v, p in values)
    return tuple((v - mean, p) for v, p in values)


def decode_spread(work: Workload, tpot: float) -> tuple[tuple[float, float], ...]:
    """Per output length, how much longer than the mean output's its decode phase takes at ``tpot`` a token (the
    mean E2E charges ``work.output_len - 1`` tokens)."""
    bins = work.bins("output")
    if len(bins) < 2:
        return ()
    return tuple(((n - work.output_len) * tpot, p) for n, p in bins)


def step_sd(ctx: StepContext, work: Workload, *, x_req: float, gap: float) -> float:
    """Standard deviation of one engine step under Poisson arrivals. In-flight batching puts each arrival's prompt
    into the next engine step (Orca, Yu et al. OSDI 2022), so the prompt tokens a step carries are compound
    Poisson: variance lambda t E[L^2] over the prompt lengths L, for ``x_req`` arrivals per second and a step of
    ``gap`` s. Each extra prompt token costs the marginal prefill time of a token (the step's weights are read
    anyway)."""
    if gap <= 0 or x_req <= 0:
        return 0.0
    bins = work.bins("input")
    mean_len = max(int(round(sum(p * n for n, p in bins))), 1)
    per_token = max(prefill_time(ctx, tokens=mean_len, prompts=2) - prefill_time(ctx, tokens=mean_len), 0.0) / mean_len
    return per_token * (x_req * gap * sum(p * n * n for n, p in bins)) ** 0.5


def tpot_spread(work: Workload, gap_sd: float, batch: Wander | None = None,
                tpot: float = 0.0) -> tuple[tuple[float, float], ...]:
    """Per output length, the standard deviation of a request's TPOT: it averages O - 1 independent steps of
    standard deviation ``gap_sd`` (``step_sd``), and, under an open loop, the batch it shares wanders (``batch``,
    averaged over its O tokens at ``tpot``; independent of the steps' noise)."""
    if gap_sd <= 0 and batch is None:
        return ()

    def sd(o: int) -> float:
        wandered = batch.tpot_sd(o * tpot) if batch is not None else 0.0
        return math.hypot(gap_sd / max(o - 1, 1) ** 0.5, wandered)

    return tuple((sd(o), p) for o, p in work.bins("output"))


def mean_prefill(ctx: StepContext, work: Workload, prompts: int = 1) -> float:
    """A prefill step of ``prompts`` prompts, averaged over the workload's prompt lengths (attention is quadratic
    in the length, so the mean length's prefill would be short of the mean prefill)."""
    return sum(p * prefill_time(ctx, tokens=n, prompts=prompts) for n, p in work.bins("input"))


def prefill_stall(ctx: StepContext, work: Workload, *, resident: int, t_p: float,
                  k: int = 1) -> tuple[float, float]:
    """(extra time, share of decode steps) of the steps that carry a whole prompt, whose mean, share x time, is the
    (R - 1) t_p / (k O) that ``steady_state`` adds to every token (k prompts per prefill step); engines with
    chunked prefill take theirs from ``serve_chunked`` (``predict_load``)."""
    if resident <= 1:
        return 0.0, 0.0
    # (R - 1) / O arrivals a token; a speculating pass yields tau of them, so tau times the arrivals a pass
    return t_p, min((resident - 1) * tokens_per_pass(ctx) / k / work.output_len, 1.0)


def _wait(ctx: StepContext, work: Workload, replicas: int, *, resident: int, cap: int, x_req: float,
          service: float, t_p: float, k: int = 1) -> tuple[float, float, float]:
    """Seconds a request waits before its prefill starts: (mean, the part every request pays, probability of
    waiting beyond it)."""
    if work.offline:
        return 0.0, 0.0, 0.0
    # Prefills run one at a time: a request finds the replica's prefill busy a share rho_p = x_req t_p of the
    # time and waits as in an M/D/1 queue, rho_p / (2 (1 - rho_p)) t_p (Pollaczek-Khinchine).
    rho_p = min(x_req * t_p / k, 0.95)  # k prompts share each prefill step
    behind = rho_p / (2 * (1 - rho_p)) * t_p if resident > 1 else 0.0
    if work.concurrency:
        per = work.concurrency / replicas
        # Closed loop (Little's law): per clients cycle through wait + service at x_req; nobody waits for
        # admission while all of them are resident.
        admit = per / x_req - service if per > cap else 0.0
        if admit > behind:
            return admit, admit, 0.0
        return behind, 0.0, rho_p
    if resident < cap:  # open loop below the cap: admitted on arrival, only the prefill queue is waited for
        return behind, 0.0, rho_p
    rho = min(work.rate / replicas / x_req, 0.999)  # x_req is the throughput at the cap here
    # Kingman's G/G/1 with Poisson arrivals (c_a^2 = 1) and deterministic service (c_s^2 = 0): the prefill is the
    # service a queued request waits for; saturation is reported through rho -> 1.
    return rho / (1 - rho) * 0.5 * t_p, 0.0, rho


def _open_loop_resident(ctx: StepContext, work: Workload, cap: int, replicas: int) -> tuple[int, str]:
    """Resident requests under Poisson arrivals: Little's law R = lambda x E2E(R), iterated to its fixed point
    (capped by the KV cache and the engine)."""
    lam = work.rate / replicas
    r = 1
    for _ in range(30):
        _, t_p, _, tpot = steady_state(ctx, work, r)
        nxt = max(min(int(round(lam * (t_p + work.output_len * tpot))), cap), 1)
        if nxt == r:
            break
        r = nxt
    return r, "load" if r < cap else "kv cache"
