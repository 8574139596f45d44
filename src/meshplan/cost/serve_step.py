"""The serving step model: one prefill or decode step of a replica, from the same per-layer physics the training
model uses (``cost.ops`` GEMM shapes, ``cost.compute`` rooflines with the fitted kernel efficiencies,
``cost.comm`` collectives on the link their group spans), plus the two things serving adds: the KV cache (its
bytes per token and the replica's memory live in ``cost.serve_memory``, used by memory, admission and transfer
alike) and the engine's per-step host time.

A decode step reads every weight of the stage and the running sequences' KV once; at decode batch sizes that
is memory-bound (``gemm_time`` takes the larger of the compute and the memory roofline), and its two TP
all-reduces per layer are KB-sized, so latency-bound.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from functools import lru_cache

from meshplan.cost.calib import gpu_calibration
from meshplan.cost.comm import collective_time, plan_links
from meshplan.cost.compute import attention_time, gemm_time, memory_time
from meshplan.cost.ops import Gemm, layer_ops, op_count
from meshplan.cost.serve_adp import ATTENTION_GEMMS, gathered_ffn_time, group_tokens, probes
from meshplan.cost.serve_kernels import engine_small_kernels, kernels, step_gemms
from meshplan.cost.serve_memory import activation_element_bytes, kv_bytes_per_token, kv_shard, stage_blocks
from meshplan.errors import SpecError
from meshplan.spec.calibration import Calibration
from meshplan.spec.cluster import Pool
from meshplan.spec.engine import EngineProfile
from meshplan.spec.model import BlockSpec, LayerSpec, ModelSpec
from meshplan.spec.plan import Plan
from meshplan.spec.serving import ServePlan


@dataclass(frozen=True, kw_only=True)
class StepContext:
    """What every step of one replica needs: the model, the GPU pool, the plan, the engine, the constants. Frozen
    and hashable, so the step times below are memoised on it (the search asks the same steps of many candidates)."""

    model: ModelSpec
    pool: Pool
    plan: ServePlan
    engine: EngineProfile
    calib: Calibration
    step_host_s: float
    """Host time per engine step that no device work hides (scheduling, input preparation, sampling launch,
    detokenisation hand-off) (s): the serving calibration's per-engine constant."""
    seq_host_s: float = 0.0
    """Host time per running sequence per engine step that no device work hides (gathering its next input token,
    checking its stop conditions, handing its new token to the detokenizer: Python loops over the batch in
    schedulers that do not overlap the next step, such as sglang@v0.3.0 managers/tp_worker.py
    forward_decode_batch) (s): the serving calibration's constant per engine family."""
    allreduce_s: float = 0.0
    """Time per TP all-reduce beyond its link's latency and bandwidth: the engine kernel's cross-rank barrier, which
    waits for the slowest rank of the group (s): the serving calibration's constant per GPU generation."""
    kv_eff: float = 0.0
    """Fraction of HBM bandwidth a decode step's attention reaches streaming the KV cache (paged decode kernels:
    vLLM paged attention, FlashInfer, TRT-LLM XQA), a different kernel from the weight-streaming GEMMs that
    ``calib.mem_eff`` describes; 0 = the same as ``calib.mem_eff``."""
    request_s: float = 0.0
    """Time a request spends outside the engine's steps before its first token (HTTP server, tokenisation,
    network: NIM's TTFT "includes request queuing time, prefill time, and network latency") (s): per engine."""


def seq_cap(ctx: StepContext) -> int:
    """Most sequences a replica runs at once: the engine's cap per scheduler, one scheduler per attention
    data-parallel group (SGLang and vLLM run a scheduler process per data-parallel rank)."""
    return ctx.engine.max_num_seqs * ctx.plan.attn_dp


def step_budget(ctx: StepContext) -> int:
    """Tokens one step of a replica carries at most: the engine's budget per scheduler, per pipeline batch in
    flight (vLLM V1: max_concurrent_batches = pipeline_parallel_size, EngineCore.step_with_batch_queue) and per
    attention data-parallel group."""
    return ctx.engine.max_batched_tokens * ctx.plan.pp * ctx.plan.attn_dp


def per_generation(constants: dict, table: str, generation: str, engine: EngineProfile) -> float | None:
    """A serving kernel constant of a GPU generation: its fitted value, else, for an engine of serving kernels,
    the median of the generations fitted (they reach similar shares of each GPU's peaks across generations, not
    the training fit's: left out of the fit, Ampere's throughput rows are 9.0 % off this way and 16.7 % on the
    training constants, Hopper's 7.0 % and 9.3 %, Ada's 5.0 % and 6.6 %, benchmarks/bench_serve_generations.py),
    else None (the calibration of the training stack whose kernels the engine runs, ``kernel_stack``)."""
    t = constants.get(table, {})
    if generation in t:
        return t[generation]
    return statistics.median(t.values()) if t and not engine.kernel_stack else None


def unseen_family(constants: dict, engine: EngineProfile) -> bool:
    """Whether no row of the serving fit ran the engine's family (``seq_host_s`` is fitted per family): its host
    times are then the median of the engines fitted (a TGI or LMDeploy server has Python or C++ step loops like
    theirs, not none), as an unseen GPU generation takes the fitted generations' median (``per_generation``); the
    runtime's own decoder, timed by its training stack (``kernel_stack``), is not such an engine."""
    return not engine.kernel_stack and engine.engine not in constants.get("seq_host_s", {})


def step_context(model: ModelSpec, pool: Pool, plan: ServePlan, engine: EngineProfile, constants: dict) -> StepContext:
    """The context of a replica, with the kernel constants of its GPU and the engine's host time."""
    if plan.precision == "fp4" and pool.gpu.peak_flops("fp4") <= 0:
        from meshplan import catalog  # the error path only

        have = [n for n in catalog.gpu_names() if catalog.gpu(n).peak_flops("fp4") > 0]
        raise SpecError("serve.precision", "fp4", f"needs FP4 tensor cores, which {pool.gpu.name} has not "
                        f"({', '.join(have)} have them); use fp8 or bf16")
    calib = gpu_calibration(pool.gpu)
    gen = pool.gpu.generation
    mem = per_generation(constants, "decode_mem_eff", gen, engine)
    if mem:
        calib = calib.with_(mem_eff=mem)
    # A prefill runs attention forward only, in the engine's fused kernels (TRT-LLM FMHA, FlashInfer, FA3 on
    # Hopper), whose efficiency is not the training fit's forward+backward average of the training stacks' kernels
    att = per_generation(constants, "prefill_attn_eff", gen, engine)
    if att:
        calib = calib.with_(attn_eff=att)

    # An engine's GEMMs (weights quantized once offline, forward only: no backward, no Transformer Engine amax
    # history or transposes) reach their own share of each dtype's peak, not the training stacks' fit
    gemm = per_generation(constants, "engine_gemm_eff", gen, engine)
    if gemm:
        calib = calib.with_(gemm_eff=gemm, fp8_eff=gemm)
    kv_eff = per_generation(constants, "decode_kv_eff", gen, engine) or 0.0

    unseen = unseen_family(constants, engine)

    def per_engine(table: str) -> float:
        # A profile's own constant, else that of the profile it shares its code with, else its family's (vllm,
        # sglang, trtllm), else, for a family no fitted row ran, the median of the engines fitted, else none.
        t = constants.get(table, {})
        fallback = statistics.median(t.values()) if unseen and t else 0.0
        return t.get(engine.name, t.get(engine.host_of, t.get(engine.engine, fallback)))
    return StepContext(model=model, pool=pool, plan=plan, engine=engine, calib=calib, kv_eff=kv_eff,
                       step_host_s=per_engine("step_host_s"), seq_host_s=per_engine("seq_host_s"),
                       allreduce_s=per_generation(constants, "allreduce_s", gen, engine) or 0.0,
                       request_s=per_engine("request_s"))


def host_time(ctx: StepContext, seqs: int) -> float:
    """Host time of one engine step over ``seqs`` sequences: the per-step part plus the per-sequence part (each
    attention data-parallel group's scheduler loops over its own share, in its own process)."""
    return ctx.step_host_s + group_tokens(ctx.plan, seqs) * ctx.seq_host_s


def with_host(ctx: StepContext, device: float, seqs: int) -> float:
    """A step of ``device`` seconds on the GPUs with its host work over ``seqs`` sequences: their sum, or the longer
    of the two when the scheduler prepares the next step while this one runs (``EngineProfile.overlap_host``)."""
    host = host_time(ctx, seqs)
    return max(device, host) if ctx.engine.overlaps_host(ctx.plan.pp) else device + host


def _probe(ctx: StepContext, seq: int) -> Plan:
    """The training plan whose per-rank GEMM shapes are the replica's attention group's (``serve_adp.probes``)."""
    return probes(ctx.model, ctx.plan, seq)[0]


def allreduce_time(ctx: StepContext, nbytes: float) -> float:
    """One TP all-reduce of ``nbytes``: the engine's one-shot NVLink kernel below its size limit (each rank reads
    every peer's buffer: two flag latencies plus (tp-1) copies at link bandwidth; vLLM custom_all_reduce.cuh
    cross_device_reduce_1stage, TRT-LLM ONESHOT), else NCCL's ring (``collective_time``)."""
    tp = ctx.plan.tp
    if tp <= 1:
        return 0.0
    link = plan_links(_probe(ctx, 1), ctx.pool).tp
    if nbytes <= ctx.engine.custom_allreduce_bytes and link.level == "nvlink":
        return 2 * link.latency + (tp - 1) * nbytes / (link.bandwidth * ctx.calib.intra_eff) + ctx.allreduce_s
    return collective_time("all_reduce", nbytes, size=tp, link=link, calib=ctx.calib) + ctx.allreduce_s


PARTS = ("gemm", "attention", "elementwise", "allreduce", "dispatch")
"""What one layer's time splits into (``layer_parts``)."""


def layer_parts(ctx: StepContext, layer: LayerSpec, *, tokens: int, seq: int, kv_tokens: float,
                busy: int = 0) -> dict[str, float]:
    """One layer on one TP rank, by part: its GEMMs for ``tokens`` tokens (weights read once), the attention core
    over ``seq`` (prefill: causal flash attention) or the KV of ``kv_tokens`` cached tokens (decode), elementwise
    passes, and its two all-reduces (attention and MLP or MoE output: with experts inside the TP group, vLLM's
    and SGLang's default EP combine is that same all-reduce). Under attention data parallelism (``serve_adp``)
    the attention side runs on the busiest group's ``busy`` tokens (0: an even share) and the feed-forward side on
    all of them, which are gathered and reduce-scattered around it."""
    attn_plan, ffn_plan = probes(ctx.model, ctx.plan, seq)
    mine, stack = busy or group_tokens(ctx.plan, tokens), kernels(ctx.engine)
    ops = layer_ops(layer, tokens=mine, plan=attn_plan, stack=stack, seq=seq)
    gemms = list(ops.gemms)
    if ctx.plan.attn_dp > 1:
        ffn = layer_ops(layer, tokens=tokens, plan=ffn_plan, stack=stack, seq=seq)
        gemms = [g for g in ops.gemms if g.name in ATTENTION_GEMMS] + [g for g in ffn.gemms
                                                                        if g.name not in ATTENTION_GEMMS]
    dtype = ctx.plan.precision if ctx.plan.precision in ("fp4", "int4") else attn_plan.precision
    gpu, calib = ctx.pool.gpu, ctx.calib
    parts = dict.fromkeys(PARTS, 0.0)
    swaps = not ctx.engine.kernel_stack  # a GPU engine's kernels (the runtime's own decoder runs torch's matmuls)
    parts["gemm"] = sum(gemm_time(g, gpu=gpu, calib=calib, dtype=dtype, few_rows=swaps)
                        for g in step_gemms(ctx.engine, layer, gemms, tokens))
    # Each norm, activation, residual and RoPE kernel (and a MoE layer's router: top-k, block alignment and the
    # sum of its experts' outputs, vllm fused_moe.py) of a GPU engine takes at least a kernel's floor, however few
    # its bytes (the runtime's own eager decoder pays its ops as host dispatch instead, below)
    small = 0 if ctx.engine.kernel_stack else engine_small_kernels(layer)
    parts["elementwise"] = max(memory_time(ops.elementwise_bytes, gpu=gpu, calib=calib), small * calib.launch_s)
    if kv_tokens:
        kv = (kv_tokens / ctx.plan.attn_dp) * kv_bytes_per_token(layer, ctx.plan.kv_bytes) / kv_shard(layer,
                                                                                                     ctx.plan.tp)
        kv_calib = calib.with_(mem_eff=ctx.kv_eff) if ctx.kv_eff else calib
        parts["attention"] = max(memory_time(kv, gpu=gpu, calib=kv_calib), calib.launch_s)
    else:
        parts["attention"] = attention_time(ops.attn_flops, gpu=gpu, calib=calib, dtype=dtype)
    width = activation_element_bytes(ctx.plan) * layer.hidden
    if layer.attention is not None and ctx.plan.tp > 1:
        # sync_s: host wake-up per blocking call (0 on GPUs); the feed-forward output's all-reduce unless gathered
        one = allreduce_time(ctx, mine * width) + calib.sync_s
        parts["allreduce"] = one if ctx.plan.attn_dp > 1 else 2 * one
    if ctx.plan.attn_dp > 1:
        parts["allreduce"] += gathered_ffn_time(ctx.plan, ctx.pool, calib, ffn_plan=ffn_plan, nbytes=tokens * width)
    # Host dispatch that precedes every eager op on a CPU, more under DTensor TP (both 0 on GPUs, as in training)
    parts["dispatch"] = ops.n_ops * (calib.op_overhead_s + (calib.dtensor_overhead_s if ctx.plan.tp > 1 else 0.0))
    return parts


def layer_time(ctx: StepContext, layer: LayerSpec, *, tokens: int, seq: int, kv_tokens: float,
               busy: int = 0) -> float:
    return sum(layer_parts(ctx, layer, tokens=tokens, seq=seq, kv_tokens=kv_tokens, busy=busy).values())


def head_time(ctx: StepContext, rows: int) -> float:
    """The output head for ``rows`` tokens (the last token of each prefill, every decoding sequence), each
    attention group's share of them under attention data parallelism."""
    m = ctx.model
    g = Gemm(name="lm_head", m=group_tokens(ctx.plan, rows), n=max(m.vocab // ctx.plan.tp, 1), k=m.hidden)
    return gemm_time(g, gpu=ctx.pool.gpu, calib=ctx.calib, dtype="fp32" if ctx.plan.precision == "fp32" else "bf16",
                     few_rows=not ctx.engine.kernel_stack)


def stage_time(ctx: StepContext, blocks: list[BlockSpec], *, tokens: int, seq: int, kv_tokens: float,
               head_rows: int, busy: int = 0) -> float:
    """One pipeline stage's layers (and the head if ``head_rows``), memoised per distinct layer spec; ``busy``:
    the busiest attention group's tokens (``layer_parts``)."""
    memo: dict[int, float] = {}
    t = 0.0
    for b in blocks:
        if id(b) not in memo:
            memo[id(b)] = layer_time(ctx, b.layer, tokens=tokens, seq=seq, kv_tokens=kv_tokens, busy=busy)
        t += memo[id(b)]
    return t + (head_time(ctx, head_rows) if head_rows else 0.0)


def _p2p(ctx: StepContext, tokens: int) -> float:
    """A stage-to-stage send of ``tokens`` hidden states."""
    if ctx.plan.pp <= 1:
        return 0.0
    link = plan_links(_probe(ctx, 1), ctx.pool).pp
    nbytes = tokens * ctx.model.hidden * activation_element_bytes(ctx.plan)
    return collective_time("send_recv", nbytes, size=2, link=link, calib=ctx.calib)


@lru_cache(maxsize=1 << 16)
def prefill_time(ctx: StepContext, *, tokens: int, prompts: int = 1) -> float:
    """Seconds of one prefill step of ``prompts`` prompts of ``tokens`` tokens each through every stage (their
    GEMMs on all prompts' tokens at once, each prompt's own causal attention), plus one engine step of host
    time: the time to their first tokens, without queueing. A prompt is prefilled by one attention group: the
    busiest holds ceil(prompts / attn_dp) of them."""
    stages = stage_blocks(ctx.model, ctx.plan.pp)
    rows = tokens * prompts
    busy = group_tokens(ctx.plan, prompts) * tokens
    t = sum(stage_time(ctx, blocks, tokens=rows, seq=tokens, kv_tokens=0.0, busy=busy,
                       head_rows=prompts if i == len(stages) - 1 else 0) for i, blocks in enumerate(stages))
    return with_host(ctx, t + (len(stages) - 1) * _p2p(ctx, rows), prompts)


def graph_rows(ctx: StepContext, seqs: int, q: int) -> tuple[int, bool]:
    """(rows, whether a CUDA graph replays them) of a decode pass of ``seqs`` sequences of ``q`` rows each (k + 1
    speculating): padded to the next captured size, counted in tokens or in requests as the engine captures."""
    e = ctx.engine
    if e.graph_counts_tokens:
        return e.graph_batch(seqs * q), e.uses_graph(seqs * q)
    return e.graph_batch(seqs) * q, e.uses_graph(seqs)


@lru_cache(maxsize=1 << 16)
def decode_time(ctx: StepContext, *, batch: int, context: float) -> float:
    """Seconds of one decode pass of ``batch`` running sequences (mean ``context`` cached tokens): every one gains
    a token, or, speculating, its ``k`` drafts are proposed and verified (``serve_spec``: ``k + 1`` rows a sequence
    through the model, the pass yielding ``tokens_per_pass`` tokens). The batch is padded to the engine's
    CUDA-graph size, split into pp micro-batches that flow through the stages (a stage's time at batch/pp, pp of
    them per step, plus the sends), plus one engine step of host time. Above the largest CUDA graph the kernels
    are launched one by one, asynchronously (TRT-LLM enqueues its engine, PyTorch queues its kernels), so the
    launches bound a stage only when they outlast its kernels, as in ``mixed_time``."""
    from meshplan.cost.serve_spec import draft_time, verify_rows

    pp, groups, q = ctx.plan.pp, ctx.plan.attn_dp, verify_rows(ctx)
    micro = max(-(-batch // pp), 1)
    mine = group_tokens(ctx.plan, micro)  # each attention group pads its own batch to its graphs
    rows, graphed = graph_rows(ctx, mine, q)
    rows *= groups
    stages = stage_blocks(ctx.model, pp)
    slowest = max(stage_time(ctx, blocks, tokens=rows, seq=int(context), kv_tokens=micro * context,
                             head_rows=rows if i == len(stages) - 1 else 0) for i, blocks in enumerate(stages))
    launches = 0.0 if graphed else _eager_launches(ctx)
    device = pp * max(slowest, launches) + (pp - 1) * _p2p(ctx, micro) + draft_time(ctx, batch=batch, context=context)
    return with_host(ctx, device, batch)


@lru_cache(maxsize=1 << 16)
def mixed_time(ctx: StepContext, *, batch: int, context: float, chunk: int, seq: int) -> float:
    """Seconds of one iteration that decodes ``batch`` running sequences (mean ``context`` cached tokens) and
    prefills a chunk of ``chunk`` prompt tokens of ``seq``-token prompts in the same forward pass (chunked prefill,
    in-flight batching; Sarathi-Serve, Agrawal et al. OSDI'24 sec. 4, piggybacked decodes): the GEMMs run once on
    both sets of rows, so the decodes' weight reads hide under the chunk's compute; attention is the chunk's share
    of its prompts' causal attention plus the decodes' KV reads. A mixed batch replays no CUDA graph (vLLM's
    model runner and TRT-LLM capture decode-only batches), so its kernels are launched one by one: asynchronously,
    so the launches bound a stage only when they outlast its kernels."""
    from meshplan.cost.serve_spec import draft_time, verify_rows

    pp = ctx.plan.pp
    micro, part = max(-(-batch // pp), 0), max(-(-chunk // pp), 1)
    stages = stage_blocks(ctx.model, pp)
    slowest = max(_mixed_stage(ctx, blocks, decode=micro, context=context, chunk=part, seq=seq, q=verify_rows(ctx),
                               last=i == len(stages) - 1) for i, blocks in enumerate(stages))
    device = pp * max(slowest, _eager_launches(ctx)) + (pp - 1) * _p2p(ctx, micro + part)
    return with_host(ctx, device + draft_time(ctx, batch=batch, context=context), batch)


def _mixed_stage(ctx: StepContext, blocks: list[BlockSpec], *, decode: int, context: float, chunk: int, seq: int,
                 q: int, last: bool) -> float:
    """One stage of ``mixed_time``: every part of a layer on all rows (``q`` per decoding sequence: 1, or a
    speculating pass's k + 1), its attention split into the chunk's causal share and the decodes' KV reads
    (memoised per distinct layer). Whole prompts ride in one attention group each: the busiest carries
    ceil(prompts / attn_dp) of the chunk's ``seq``-token prompts."""
    memo: dict[int, float] = {}
    t = 0.0
    mine = min(chunk, group_tokens(ctx.plan, -(-chunk // max(seq, 1))) * max(seq, 1))
    for b in blocks:
        if id(b) not in memo:
            rows = layer_parts(ctx, b.layer, tokens=decode * q + chunk, seq=seq, kv_tokens=0.0,
                               busy=group_tokens(ctx.plan, decode) * q + mine)
            own = layer_parts(ctx, b.layer, tokens=chunk, seq=seq, kv_tokens=0.0, busy=mine)["attention"]
            kv = layer_parts(ctx, b.layer, tokens=decode, seq=int(context),
                             kv_tokens=decode * context)["attention"] if decode else 0.0
            memo[id(b)] = sum(rows.values()) - rows["attention"] + own + kv
        t += memo[id(b)]
    return t + (head_time(ctx, decode * q + 1) if last else 0.0)


@lru_cache(maxsize=1 << 16)
def _eager_launches(ctx: StepContext) -> float:
    """Kernel launches a stage issues when its batch is above the largest CUDA graph (each op one launch gap;
    a fused MoE kernel is one launch for all its experts, as ``serve_kernels.step_gemms`` times it)."""
    plan, stack = _probe(ctx, 1), kernels(ctx.engine)
    blocks = stage_blocks(ctx.model, ctx.plan.pp)[0]
    n_ops = 0
    for b in blocks:
        ops = layer_ops(b.layer, tokens=1, plan=plan, stack=stack)
        if stack.fused_kernels and b.layer.moe is not None:
            gemms = [replace(g, count=1) if g.grouped else g for g in ops.gemms]
            n_ops += op_count(b.layer, gemms, fused=True, fp8=plan.precision == "fp8")
        else:
            n_ops += ops.n_ops
    return n_ops * ctx.calib.launch_s


def decode_breakdown(ctx: StepContext, *, batch: int, context: float) -> dict[str, float]:
    """``decode_time`` by where the time goes (sums to it): the slowest stage's GEMMs (weight reads), KV reads,
    elementwise passes, TP all-reduces and output head, times pp micro-batches, plus the time by which eager
    launches outlast the kernels, stage sends, the drafter's proposals (speculating) and host time."""
    from meshplan.cost.serve_spec import draft_time, verify_rows

    pp, q = ctx.plan.pp, verify_rows(ctx)
    micro = max(-(-batch // pp), 1)
    mine = group_tokens(ctx.plan, micro)
    rows, graphed = graph_rows(ctx, mine, q)
    rows *= ctx.plan.attn_dp
    stages = stage_blocks(ctx.model, pp)
    best: dict[str, float] = {}
    for i, blocks in enumerate(stages):
        parts = dict.fromkeys((*PARTS, "head"), 0.0)
        for b in blocks:
            for k, v in layer_parts(ctx, b.layer, tokens=rows, seq=int(context), kv_tokens=micro * context).items():
                parts[k] += v
        parts["head"] = head_time(ctx, rows) if i == len(stages) - 1 else 0.0
        if sum(parts.values()) > sum(best.values()):
            best = parts
    out = {k: pp * v for k, v in best.items()}
    eager = 0.0 if graphed else _eager_launches(ctx)
    out["launches"] = pp * max(eager - sum(best.values()), 0.0)
    out["pp_sends"] = (pp - 1) * _p2p(ctx, micro)
    out["draft"] = draft_time(ctx, batch=batch, context=context)
    device = sum(out.values())
    out["host"] = with_host(ctx, device, batch) - device
    return out


def clear_memo() -> None:
    """Forget the memoised step times and weight bytes (a benchmark timing cold searches calls it between runs)."""
    from meshplan.cost.serve_memory import weight_bytes_per_gpu

    for f in (prefill_time, decode_time, mixed_time, _eager_launches, weight_bytes_per_gpu):
        f.cache_clear()
