"""The serving specs: *how* a model is laid out to serve (``ServePlan``) and the load it serves (``Workload``).
What the engine does is its ``EngineProfile`` (``spec.engine``); the hardware is a ``ClusterSpec``."""

from __future__ import annotations

import math
from dataclasses import dataclass

from meshplan.errors import SpecError
from meshplan.spec.hardware import DTYPE_BYTES
from meshplan.spec.lengths import lognormal_bins, lognormal_fit
from meshplan.spec.speculation import Speculation

WEIGHT_DTYPES = ("bf16", "fp16", "fp8", "fp4", "int4", "fp32")
QUANTIZED = ("fp8", "fp4", "int4")
"""Weight formats of a quantized checkpoint, whose 16-bit compute dtype and KV cache are the engine's default."""
KV_DTYPES = ("bf16", "fp16", "fp8", "fp32")
"""fp32 is what a CPU computes in (``check --serve``); GPUs serve in 16 or 8 bits."""


def _int(name: str, value, lo: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise SpecError(name, value, f"must be an integer >= {lo}")


@dataclass(frozen=True, kw_only=True)
class ServePlan:
    """One serving deployment: each replica is a tp x pp engine instance; ``replicas`` of them share the load."""

    tp: int = 1
    """Tensor-parallel degree of a replica."""
    pp: int = 1
    """Pipeline stages of a replica (decode micro-batches the running batch over them)."""
    ep: int = 1
    """Expert-parallel degree inside a replica (MoE)."""
    replicas: int = 1
    """Independent engine instances (data parallel); requests are spread evenly."""
    attn_dp: int = 1
    """Attention data parallelism inside a replica (MoE models): ``attn_dp`` groups of ``tp`` GPUs each run
    attention, with their own KV cache and scheduler, for their share of the requests, and the replica's
    ``tp x attn_dp`` GPUs together run the feed-forward layers on every group's tokens, experts over ``ep`` of them
    (SGLang ``--enable-dp-attention``, vLLM ``--data-parallel-size`` with ``--enable-expert-parallel``,
    TensorRT-LLM ``enable_attention_dp``): MLA's latent, which TP replicates, is then stored once."""
    precision: str = "bf16"
    """Weight and GEMM precision (``fp8``: weights and activations in fp8, as TensorRT-LLM's FP8 quantization;
    ``fp4``: NVFP4 weights and activations, ModelOpt's W4A4 recipe, on GPUs with FP4 tensor cores; ``int4``: AWQ /
    GPTQ weight-only 4-bit weights with 16-bit activations)."""
    kv_dtype: str = "bf16"
    """KV-cache element type."""
    engine: str = "vllm"
    """Serving-engine profile name (``catalog/engines``)."""
    speculation: Speculation | None = None
    """Speculative decoding (``spec.speculation``), or none."""

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "ep", "replicas", "attn_dp"):
            _int(f"serve.{name}", getattr(self, name), 1)
        if self.attn_dp > 1 and self.pp > 1:
            raise SpecError("serve.attn_dp", self.attn_dp, "attention data parallelism runs without pipeline "
                            "stages (pp = 1)")
        if self.ep > self.moe_group or self.moe_group % self.ep:
            raise SpecError("serve.ep", self.ep, f"must divide the {self.moe_group} GPUs that run the experts "
                            f"(tp x attn_dp = {self.tp} x {self.attn_dp})")
        if self.precision not in WEIGHT_DTYPES:
            raise SpecError("serve.precision", self.precision, f"must be one of {', '.join(WEIGHT_DTYPES)}")
        if self.kv_dtype not in KV_DTYPES:
            raise SpecError("serve.kv_dtype", self.kv_dtype, f"must be one of {', '.join(KV_DTYPES)}")
        if self.speculation is not None and self.pp > 1:
            raise SpecError("serve.speculation", self.speculation.method, "speculative decoding is planned on "
                            "replicas of one pipeline stage (pp = 1)")

    @property
    def gpus_per_replica(self) -> int:
        """GPUs of one replica: tp * pp * attn_dp (ep folds inside them)."""
        return self.tp * self.pp * self.attn_dp

    @property
    def moe_group(self) -> int:
        """GPUs of a stage that run the feed-forward layers together (experts over ep, each sliced over the rest):
        the TP group, or every attention group's under attention data parallelism."""
        return self.tp * self.attn_dp

    @property
    def n_gpus(self) -> int:
        """GPUs of the deployment."""
        return self.gpus_per_replica * self.replicas

    @property
    def weight_bytes(self) -> float:
        """Bytes of one weight element."""
        return DTYPE_BYTES[self.precision]

    @property
    def kv_bytes(self) -> float:
        """Bytes of one KV-cache element."""
        return DTYPE_BYTES[self.kv_dtype]


MAX_CLIENTS = 100_000
"""Most clients of a closed loop: the benchmark replay keeps every client (a second per ~40,000 on this project's
CI machine), and no serving benchmark runs more than a few thousand."""


@dataclass(frozen=True, kw_only=True)
class Workload:
    """Requests of ``input_len`` prompt tokens generating ``output_len`` tokens, under a closed loop of
    ``concurrency`` clients, an open loop of ``rate`` requests/s, or offline (neither: as many as fit)."""

    input_len: int
    """Prompt tokens per request (mean)."""
    output_len: int
    """Generated tokens per request (mean)."""
    concurrency: int = 0
    """Closed loop: requests in flight (each client sends its next request when the last one ends); 0 = not."""
    rate: float = 0.0
    """Open loop: Poisson arrivals per second; 0 = not."""
    input_hist: tuple[tuple[int, float], ...] = ()
    """Variable prompts: (length, weight) bins (``input_len`` is then their rounded mean); empty = fixed."""
    output_hist: tuple[tuple[int, float], ...] = ()
    """Variable outputs: (length, weight) bins (``output_len`` is then their rounded mean); empty = fixed."""

    def __post_init__(self) -> None:
        _int("workload.input_len", self.input_len, 1)
        _int("workload.output_len", self.output_len, 1)
        for name in ("input_hist", "output_hist"):
            for length, weight in getattr(self, name):
                _int(f"workload.{name} length", length, 1)
                if not isinstance(weight, (int, float)) or not 0 < weight < math.inf:
                    raise SpecError(f"workload.{name} weight", weight, "must be a finite number > 0")
        _int("workload.concurrency", self.concurrency, 0)
        if self.concurrency > MAX_CLIENTS:
            raise SpecError("workload.concurrency", self.concurrency, f"must be at most {MAX_CLIENTS:,} clients: "
                            "a load that large is an open loop (give its arrival rate)")
        if not isinstance(self.rate, (int, float)) or not 0 <= self.rate < math.inf:
            raise SpecError("workload.rate", self.rate, "must be a finite number of requests per second >= 0")
        if self.concurrency and self.rate:
            raise SpecError("workload", f"concurrency={self.concurrency}, rate={self.rate}",
                            "give a closed loop (concurrency) or an open loop (rate), not both")

    @property
    def offline(self) -> bool:
        """No loop given: every request is queued at once (offline throughput, e.g. trtllm-bench)."""
        return not self.concurrency and not self.rate

    def bins(self, which: str) -> tuple[tuple[int, float], ...]:
        """(length, probability) bins of ``input`` or ``output`` lengths (one bin when fixed)."""
        hist = self.input_hist if which == "input" else self.output_hist
        if not hist:
            return ((self.input_len if which == "input" else self.output_len, 1.0),)
        total = sum(w for _, w in hist)
        return tuple((n, w / total) for n, w in hist)

    @property
    def resident_output(self) -> float:
        """Mean output length of a request found resident: length-biased, E[O^2] / E[O], since a request stays
        resident for its whole output (the inspection paradox; = O when fixed)."""
        b = self.bins("output")
        return sum(p * n * n for n, p in b) / sum(p * n for n, p in b)

    @property
    def mean_context(self) -> float:
        """Mean cached tokens of a resident request: its prompt plus half its (length-biased) output."""
        return sum(p * n for n, p in self.bins("input")) + self.resident_output / 2.0

    @property
    def longest(self) -> int:
        """Tokens of the longest request (prompt plus output) the workload sends."""
        return max(n for n, _ in self.bins("input")) + max(n for n, _ in self.bins("output"))


def workload_from_hist(inputs: tuple[tuple[int, float], ...], outputs: tuple[tuple[int, float], ...],
                       **load) -> Workload:
    """A workload of variable lengths: each histogram of (length, weight) bins; the mean lengths rounded."""
    def mean(hist) -> int:
        total = sum(w for _, w in hist)
        return max(int(round(sum(n * w for n, w in hist) / total)), 1) if total > 0 else 0
    return Workload(input_len=mean(inputs), output_len=mean(outputs), input_hist=tuple(inputs) if len(inputs) > 1
                    else (), output_hist=tuple(outputs) if len(outputs) > 1 else (), **load)


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """A benchmark scenario that runs Poisson arrivals at the highest rate whose latency percentiles stay within
    its constraints (MLPerf Inference Server: the submitter raises the target QPS until p99 TTFT or TPOT fails)."""

    name: str
    ttft: float
    """TTFT bound (s) at ``percentile``."""
    tpot: float
    """TPOT bound (s) at ``percentile``."""
    percentile: float = 0.99
    source: str = ""

    def __post_init__(self) -> None:
        for key in ("ttft", "tpot"):
            v = getattr(self, key)
            if not isinstance(v, (int, float)) or not v > 0:
                raise SpecError(f"scenario[{self.name}].{key}", v, "must be a time > 0 (s)")
        if not 0 < self.percentile < 1:
            raise SpecError(f"scenario[{self.name}].percentile", self.percentile, "must be between 0 and 1")
        if not self.source:
            raise SpecError(f"scenario[{self.name}].source", "", "every scenario must cite its constraints")


@dataclass(frozen=True, kw_only=True)
class Dataset:
    """A benchmark's prompt set as its harness samples it (``catalog/datasets``): the lengths a row or a command
    names by the dataset's name instead of numbers."""

    name: str
    matches: tuple[str, ...]
    """Lower-case prefixes of a validation row's ``input_len`` text that name this dataset."""
    input_mean: int
    """Mean prompt tokens per request as the harness samples and tokenizes them."""
    output_mean: int
    """Mean generated tokens per request (the dataset's reply lengths)."""
    input_hist: tuple[tuple[int, float], ...] = ()
    """(length, weight) bins where a source publishes them; empty = only the mean is known."""
    output_hist: tuple[tuple[int, float], ...] = ()
    input_median: int = 0
    """Median prompt tokens where a source publishes a median but no histogram (0 = not published)."""
    output_median: int = 0
    """Median generated tokens, likewise: with the mean it sets a log-normal histogram (``spec.lengths``)."""
    length_range: tuple[int, int] = (1, 1 << 20)
    """(shortest, longest) tokens of a request's prompt or output the harness keeps (its sampling filter)."""
    source: str = ""
    """Where the lengths come from."""
    scenarios: tuple[Scenario, ...] = ()
    """The benchmark's latency-bound scenarios on this dataset (MLPerf Server, Interactive)."""

    def __post_init__(self) -> None:
        _int(f"dataset[{self.name}].input_mean", self.input_mean, 1)
        _int(f"dataset[{self.name}].output_mean", self.output_mean, 1)
        self._check_lengths()
        if not self.source:
            raise SpecError(f"dataset[{self.name}].source", "", "every dataset must cite where its lengths come from")

    def _check_lengths(self) -> None:
        """The harness's length range and any published median: a median needs the range to hold it below the mean,
        and a log-normal through both to exist within the range."""
        where = f"dataset[{self.name}]"
        rng = self.length_range
        if not (isinstance(rng, tuple) and len(rng) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                                  for v in rng) and 1 <= rng[0] < rng[1]):
            raise SpecError(f"{where}.length_range", list(rng) if isinstance(rng, tuple) else rng,
                            "must be [shortest, longest]: whole token counts, 1 <= shortest < longest")
        lo, hi = rng
        for which in ("input", "output"):
            median, mean = getattr(self, f"{which}_median"), getattr(self, f"{which}_mean")
            _int(f"{where}.{which}_median", median, 0)
            if not median:
                continue
            if not lo <= mean < hi:
                raise SpecError(f"{where}.{which}_mean", mean, f"must lie within length_range {lo}..{hi - 1} "
                                "to build its histogram from the median")
            if not lo < median < mean:
                raise SpecError(f"{where}.{which}_median", median,
                                f"must lie in {lo + 1}..{mean - 1} (above the shortest length, below the mean "
                                f"{mean}: lengths skew right)")
            lognormal_fit(mean, median, lo, hi, where=f"{where}.{which}_median")  # a mean the range cannot reach

    def scenario(self, name: str) -> Scenario:
        """The scenario called ``name`` (``server``, ``interactive``)."""
        for s in self.scenarios:
            if s.name == name:
                return s
        known = ", ".join(s.name for s in self.scenarios) or "none"
        raise SpecError(f"dataset[{self.name}].scenario", name, f"must be one this benchmark defines ({known})")

    def bins(self, which: str) -> tuple[tuple[int, float], ...]:
        """(length, weight) bins of ``input`` or ``output`` lengths: the published histogram, else a log-normal
        through the published mean and median, else one bin at the mean."""
        hist = self.input_hist if which == "input" else self.output_hist
        mean = self.input_mean if which == "input" else self.output_mean
        median = self.input_median if which == "input" else self.output_median
        if hist:
            return hist
        return lognormal_bins(mean, median, *self.length_range) if median else ((mean, 1.0),)

    def workload(self, **load) -> Workload:
        """The dataset's requests under ``load`` (concurrency, rate or offline)."""
        return workload_from_hist(self.bins("input"), self.bins("output"), **load)


def dataset_from_dict(d: dict, where: str) -> Dataset:
    """A dataset from its TOML table."""
    allowed = {"name", "matches", "input_mean", "output_mean", "input_hist", "output_hist", "input_median",
               "output_median", "length_range", "source", "scenarios"}
    bad = sorted(set(d) - allowed)
    if bad:
        raise SpecError(where, bad, f"unknown dataset fields; known: {', '.join(sorted(allowed))}")
    kw = dict(d)
    kw["matches"] = tuple(str(m).lower() for m in d.get("matches", ()))
    for side in ("input_hist", "output_hist"):
        try:
            kw[side] = tuple((int(n), float(w)) for n, w in d.get(side, ()))
        except (TypeError, ValueError):
            raise SpecError(f"{where}.{side}", d.get(side), "must be a list of [length, weight] pairs") from None
    if "length_range" in d:
        rng = d["length_range"]
        kw["length_range"] = tuple(rng) if isinstance(rng, list) else rng
    scen = d.get("scenarios", {})
    kw["scenarios"] = tuple(_scenario(name, t, f"{where}.scenarios.{name}") for name, t in scen.items())
    try:
        return Dataset(**kw)
    except TypeError as exc:
        raise SpecError(where, d.get("name"), str(exc)) from None


def _scenario(name: str, t: dict, where: str) -> Scenario:
    """A scenario from its TOML table (``ttft_ms``, ``tpot_ms``, ``percentile``, ``source``)."""
    bad = sorted(set(t) - {"ttft_ms", "tpot_ms", "percentile", "source"})
    if bad:
        raise SpecError(where, bad, "unknown scenario fields; known: percentile, source, tpot_ms, ttft_ms")
    try:
        return Scenario(name=name, ttft=float(t["ttft_ms"]) / 1e3, tpot=float(t["tpot_ms"]) / 1e3,
                        percentile=float(t.get("percentile", 0.99)), source=str(t.get("source", "")))
    except (KeyError, TypeError, ValueError) as exc:
        raise SpecError(where, t, f"needs ttft_ms and tpot_ms as numbers ({exc})") from None
