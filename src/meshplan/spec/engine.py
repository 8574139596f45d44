"""The serving-engine profile: what an inference engine does that a layout does not say (KV memory sizing and
admission, batching caps, chunked prefill, CUDA-graph batch sizes, custom all-reduce, multi-step streaming, how
its benchmark defines TPOT). The serving counterpart of ``FrameworkProfile``; presets live in
``catalog/engines/*.toml``, each field citing the engine's source at a version in ``[sources]``."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields

from meshplan.errors import SpecError

# llm-d is a Kubernetes serving stack whose model server is vLLM (llm-d/llm-d README: "vLLM as the model server"),
# so a row that names only llm-d ran vLLM's engine.
FAMILY_NAMES = {"vllm": ("vllm", "llm-d"), "sglang": ("sglang",),
                "trtllm": ("tensorrt-llm", "tensorrt_llm", "tensorrt llm", "trt-llm", "trtllm"),
                "tgi": ("text-generation-inference", "text generation inference", "tgi"),
                "lmdeploy": ("lmdeploy", "turbomind"),
                "fastgen": ("deepspeed-fastgen", "deepspeed fastgen", "deepspeed-mii", "deepspeed mii", "fastgen"),
                "meshplan": ("meshplan",)}
"""Engine families and the names sources print for them (lower case), for reading a row's ``framework`` text."""
STACK_NAMES = ("llm-d",)
"""Names in ``FAMILY_NAMES`` of stacks built around an engine: the release number after them is the stack's, not
the engine's."""
ENGINES = tuple(FAMILY_NAMES)
KV_FRACTION_OF = ("total", "free", "static")
ADMISSIONS = ("lazy", "reserve")
REPORTS = ("mean", "median")
CLOSED_LOOP_ROUNDS = 10
"""Requests per client of a closed-loop benchmark run: meshplan's exported bench.sh (``serve_common.num_prompts``)
and InferenceX's harness (``num_prompts = 10 * conc``) send ten, so the steady state outweighs the start."""
"""Statistics a harness reports its latencies as (``EngineProfile.reports``)."""
BUILD_SIZINGS = ("none", "trtllm-bench", "trtllm-bench-pytorch", "vllm-v0", "vllm-v1", "sglang", "tgi-v3", "lmdeploy")
"""Rules the engine or its benchmark tool sizes its caps by before it runs, from the workload or the model
(``cost.serve_sizing.SIZINGS``)."""


@dataclass(frozen=True, kw_only=True)
class EngineProfile:
    """One serving engine at one version."""

    name: str
    """Catalog name, e.g. ``vllm-0.6.0``."""
    engine: str
    """Engine family: ``vllm``, ``sglang``, ``trtllm`` (NIM and MLPerf harnesses run TensorRT-LLM), ``tgi``,
    ``lmdeploy``, ``fastgen`` (DeepSpeed-MII) or ``meshplan`` (the runtime's own decode loop, ``runtime.decode``)."""
    version: str
    """The release the facts are read from."""
    since: str = ""
    """The first release whose defaults the profile describes ("" = ``version``): a row naming a release takes the
    family's release profile with the latest ``since`` at or below it (vLLM's V1 profile from 0.8.0, its default)."""
    host_of: str = ""
    """The profile whose fitted host times this one shares, being the same release's code under other flags
    ("" = its own, then its family's)."""
    summary: str = ""
    """One line for listings."""
    matches: tuple[str, ...] = ()
    """Prefixes of a validation row's ``framework`` column that this profile reproduces (data, not a regex)."""
    mentions: tuple[str, ...] = ()
    """Words (any case) a row's ``framework`` text must all contain, anywhere, for this profile to describe it from
    its ``since`` release on: a benchmark tool the row names beside the engine (``trtllm-bench``)."""
    harness: bool = False
    """The profile reproduces one source's harness or launch flags beyond its release's defaults (a benchmark's
    ``--num-scheduler-steps``, NIM, MLPerf), so it never stands in for another row of its family."""
    kv_memory_fraction: float = 0.9
    """The engine's KV memory knob (vLLM ``gpu_memory_utilization``, SGLang ``mem_fraction_static``, TRT-LLM
    ``free_gpu_memory_fraction``)."""
    kv_fraction_of: str = "total"
    """What the knob is a fraction of: ``total`` (vLLM: total x util - weights - profile-run peak), ``free``
    (TRT-LLM: fraction of the memory free after the engine is loaded), ``static`` (SGLang: weights + KV pool
    within fraction x total)."""
    activation_tokens: int = 8192
    """Tokens of the largest step the engine sizes activation memory for (the profile run / max_num_tokens)."""
    runtime_reserve_gib: float = 1.5
    """Memory outside weights, KV and activations: CUDA context, NCCL and custom all-reduce buffers, CUDA graphs
    (GiB)."""
    block_size: int = 16
    """KV tokens per block (page); each sequence wastes under one block."""
    max_num_seqs: int = 256
    """Most sequences running at once."""
    max_batched_tokens: int = 8192
    """Most tokens one step schedules (prefill chunk plus decodes)."""
    chunked_prefill: bool = False
    """A prompt longer than the step's token budget is split into chunks over several steps."""
    mixed_batches: bool = False
    """Prompt tokens run in the same forward as the running decodes (vLLM chunked prefill, TensorRT-LLM in-flight
    batching); False: a prefill batch is a forward of its own that pauses every decode (SGLang without
    ``--enable-mixed-chunk``, vLLM 0.6 without chunked prefill)."""
    admission: str = "lazy"
    """``lazy``: KV blocks are taken as sequences grow (vLLM, SGLang: preempt when full); ``reserve``: a request is
    admitted only with room for its whole output (TRT-LLM GUARANTEED_NO_EVICT)."""
    cuda_graph_max_batch: int = 256
    """Largest decode batch replayed from a CUDA graph; larger batches run eagerly (0 = no graphs)."""
    cuda_graph_step: int = 8
    """Captured batch sizes: 1, 2, 4, then multiples of this up to the maximum; a batch pads up to the next."""
    custom_allreduce_bytes: float = 0.0
    """Messages up to this size use the engine's one-shot NVLink all-reduce instead of NCCL (0 = none)."""
    fp8_kv: bool = False
    """An fp8-quantized checkpoint also stores its KV cache in fp8 (TensorRT-LLM's FP8 recipe); else the KV stays
    16-bit unless asked."""
    kernel_stack: str = ""
    """The training-stack profile (``catalog/frameworks``) whose kernels the engine runs, for its op count and
    fusion; empty: the fused serving kernels every GPU engine has (FlashAttention/FlashInfer, fused norms)."""
    build_sizing: str = "none"
    """How the engine or the benchmark that runs it sizes ``max_num_seqs``, ``max_batched_tokens``, chunked prefill
    and the activation tokens before it starts (``trtllm-bench``: its engine build heuristics from the workload;
    ``vllm-v0``: vLLM V0's defaults from the model's context length); ``none``: as given."""
    overlap_host: bool = False
    """The scheduler prepares the next step while the GPUs run this one (SGLang's overlap scheduler, TensorRT-LLM's
    PyTorch backend), so a step takes the longer of its kernels and its host work, not their sum."""
    overlap_max_pp: int = 0
    """Largest pipeline degree the overlap scheduler runs with (SGLang turns it off beyond 1); 0 = any."""
    max_pp: int = 0
    """Largest pipeline degree the engine runs (TGI and LMDeploy shard by tensor parallelism only: 1); 0 = any."""
    seq_cap_settable: bool = True
    """A launch flag caps the running sequences below ``max_num_seqs`` (vLLM ``--max-num-seqs``, TGI 2
    ``--max-batch-size``); False where the engine ignores it (TGI 3 under prefill chunking), so the search does not
    try lower caps it could not deploy."""
    max_context: int = 0
    """Most tokens one sequence may hold, prompt plus output, whatever the model was trained to (DeepSpeed inference
    v2's ``max_context``, which sizes its KV metadata); 0 = the model's own context."""
    attention_dp: bool = False
    """The engine runs attention data-parallel inside a replica, the experts spread over all its GPUs (SGLang
    ``--enable-dp-attention``, vLLM V1 ``--data-parallel-size`` with ``--enable-expert-parallel``, TensorRT-LLM
    ``enable_attention_dp``): ``ServePlan.attn_dp`` layouts are planned for it."""
    attention_dp_tp: int = 0
    """Largest TP degree of one attention group under attention data parallelism (TensorRT-LLM's
    ``enable_attention_dp`` gives every rank its own attention: 1); 0 = any."""
    disaggregation: bool = True
    """The engine runs prefill and decode on separate pools with a KV transfer between them (Dynamo's vLLM, SGLang
    and TensorRT-LLM backends); False: only aggregated deployments are planned for it."""
    multi_step: int = 1
    """Decode steps scheduled per host round (vLLM ``--num-scheduler-steps``); streamed chunks carry that many
    tokens, so ITL is that many steps."""
    client_rounds: int = CLOSED_LOOP_ROUNDS
    """Requests each client of a closed-loop benchmark sends, all clients starting at once, every request counted
    (``vllm bench serve`` / ``sglang.bench_serving`` with ``--num-prompts`` = this x ``--max-concurrency``:
    meshplan's bench.sh, and InferenceX's harness)."""
    client_warm: bool = False
    """The benchmark reports a steady state, the run's start discarded (a warm-up, or time windows long enough
    for it not to weigh), so the first requests, which start together, do not count. The profile's source says
    why: genai-perf's own defaults read three windows from the start (``--stability-percentage 999``)."""
    graph_counts_tokens: bool = False
    """The CUDA-graph sizes count tokens (vLLM V1: a speculating decode of b sequences runs as b x (k + 1) tokens
    and pads to a captured token count), not requests (SGLang's cuda_graph_max_bs, TensorRT-LLM's batch_sizes)."""
    speculative_no_adp: tuple[str, ...] = ()
    """Drafters the engine refuses under data-parallel attention."""
    speculative: tuple[str, ...] = ()
    """Speculative-decoding drafters the release runs (``spec.speculation.SPEC_METHODS``); empty: none (or none
    this profile has read), so a plan that speculates is refused on it."""
    reports: str = "mean"
    """The statistic a harness profile's published latencies are: ``mean`` or ``median`` (over requests for
    TTFT, TPOT and end-to-end latency, over streamed gaps for ITL)."""
    sources: dict = field(default_factory=dict, compare=False, hash=False)
    """Field name -> the public source of its value."""

    def __post_init__(self) -> None:
        for name, opts in (("engine", ENGINES), ("kv_fraction_of", KV_FRACTION_OF), ("admission", ADMISSIONS),
                           ("build_sizing", BUILD_SIZINGS), ("reports", REPORTS)):
            if getattr(self, name) not in opts:
                raise SpecError(f"engine.{name}", getattr(self, name), f"must be one of {', '.join(opts)}")
        from meshplan.spec.speculation import SPEC_METHODS

        bad = [m for m in (*self.speculative, *self.speculative_no_adp) if m not in SPEC_METHODS]
        if bad:
            raise SpecError("engine.speculative", bad, f"drafters are {', '.join(SPEC_METHODS)}")
        if not 0 < self.kv_memory_fraction <= 1:
            raise SpecError("engine.kv_memory_fraction", self.kv_memory_fraction, "must be in (0, 1]")
        for name in ("activation_tokens", "block_size", "max_num_seqs", "max_batched_tokens", "cuda_graph_step",
                     "multi_step", "client_rounds"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise SpecError(f"engine.{name}", v, "must be an integer >= 1")
        if (self.cuda_graph_max_batch < 0 or self.custom_allreduce_bytes < 0 or self.runtime_reserve_gib < 0
                or self.overlap_max_pp < 0 or self.max_pp < 0 or self.max_context < 0 or self.attention_dp_tp < 0):
            raise SpecError(f"engine {self.name}", "negative size", "sizes must be >= 0")

    def overlaps_host(self, pp: int) -> bool:
        """Whether a replica of ``pp`` pipeline stages runs the overlap scheduler (``overlap_host``)."""
        return self.overlap_host and (self.overlap_max_pp == 0 or pp <= self.overlap_max_pp)

    @property
    def version_key(self) -> tuple[int, ...]:
        """The release as numbers for ordering (``0.6.0`` -> (0, 6, 0)); () when it is not a dotted number."""
        return version_tuple(self.version)

    @property
    def since_key(self) -> tuple[int, ...]:
        """The first release the profile describes, as numbers (``since``, else ``version``)."""
        return version_tuple(self.since or self.version)

    def graph_batch(self, batch: int) -> int:
        """The batch a decode step of ``batch`` sequences runs at: padded up to the next captured CUDA-graph size
        (1, 2, 4, then multiples of ``cuda_graph_step``), or as is above the largest (eager)."""
        if batch > self.cuda_graph_max_batch or batch <= 0:
            return batch
        for size in (1, 2, 4):
            if batch <= size:
                return size
        step = self.cuda_graph_step
        return min(-(-batch // step) * step, self.cuda_graph_max_batch)

    def uses_graph(self, batch: int) -> bool:
        """Whether a decode step of ``batch`` sequences replays a CUDA graph (no per-kernel host launches)."""
        return 0 < batch <= self.cuda_graph_max_batch


def version_tuple(text: str) -> tuple[int, ...]:
    """The leading dotted number of ``text`` (``v0.8.5rc1`` -> (0, 8, 5)); () when there is none."""
    got = re.match(r"v?(\d+(?:\.\d+)*)", text.strip().lower())
    return tuple(int(x) for x in got.group(1).split(".")) if got else ()


IDENTITY = ("name", "engine", "version", "since", "host_of", "summary", "matches", "mentions", "harness", "sources",
            "kernel_stack")
"""Fields that say which engine a profile is, not how it runs."""
SETTINGS = tuple(f.name for f in fields(EngineProfile) if f.name not in IDENTITY)
"""Fields a command may change for one prediction (``--max-num-seqs``...)."""


def engine_from_dict(d: dict, where: str) -> EngineProfile:
    """An engine profile from its TOML table; every setting needs a ``[sources]`` entry."""
    if not isinstance(d, dict):
        raise SpecError(where, d, "must be a table")
    allowed = {f.name for f in fields(EngineProfile)}
    bad = sorted(set(d) - allowed)
    if bad:
        raise SpecError(where, bad, f"unknown engine fields; known: {', '.join(sorted(allowed))}")
    kw = dict(d)
    kw["matches"] = tuple(kw.get("matches", ()))
    kw["mentions"] = tuple(kw.get("mentions", ()))
    kw["speculative"] = tuple(kw.get("speculative", ()))
    kw["speculative_no_adp"] = tuple(kw.get("speculative_no_adp", ()))
    sources = kw.get("sources", {})
    missing = [k for k in d if (k in SETTINGS or k in ("since", "host_of")) and k not in sources]
    if missing:
        raise SpecError(f"{where}.sources", missing, "every setting must cite its source")
    try:
        return EngineProfile(**kw)
    except TypeError as exc:
        raise SpecError(where, d.get("name"), str(exc)) from None
