"""``bench.sh``: the benchmark client command that measures the load a serving plan was made for, against the
endpoint the launch script starts.

Two clients: vLLM's ``vllm bench serve`` (vLLM 0.11.0 ``vllm/benchmarks/serve.py``), used for vLLM and for
TensorRT-LLM's OpenAI endpoint (TensorRT-LLM's own ``tensorrt_llm/serve/scripts/benchmark_serving.py`` is a copy of
vLLM's benchmark_serving.py), and SGLang's ``python -m sglang.bench_serving``. Every request has exactly the planned
prompt and output length: random prompts of fixed length and EOS ignored.
"""

from __future__ import annotations

from meshplan.export.serve_common import HOST, Launch, ServeJob, header, num_prompts, script

VLLM_CLIENT = "vllm bench serve of vLLM 0.11.0"
"""The vLLM client release whose flags ``vllm_bench`` writes (checked by that release's parser)."""

VLLM_060_CLIENT_NOTE = (
    "client: vLLM 0.11's vllm bench serve, run from a vLLM >= 0.11 install on the client machine: v0.6.0's "
    "benchmarks/benchmark_serving.py has no --max-concurrency (added by vllm-project/vllm#9390, 2024-10) and sends "
    "--ignore-eos only with its first test request (fixed by vllm-project/vllm#9349, 2024-10), so it cannot hold "
    "the planned output length")


def loop_args(job: ServeJob, *, concurrency_flag: str | None) -> list[str]:
    """The arrival process: a closed loop of N clients (``--max-concurrency N``, all sent at once and held to N in
    flight), an open Poisson loop (``--request-rate R``: both clients draw exponential gaps), or offline (rate inf:
    every request at time 0)."""
    w = job.work
    if w.concurrency:
        if concurrency_flag is None:
            raise ValueError("this client has no concurrency limit")
        return [concurrency_flag, str(w.concurrency), "--request-rate", "inf"]
    return ["--request-rate", f"{w.rate:g}" if w.rate else "inf"]


def vllm_bench(job: ServeJob, *, backend: str, port: int) -> Launch:
    """``vllm bench serve`` against ``HOST:port``: ``--dataset-name random`` with ``--random-range-ratio 0`` (lengths
    drawn from [len x (1 - r), len x (1 + r)], vllm/benchmarks/datasets.py RandomDataset: 0 = exact) and
    ``--ignore-eos`` (default off)."""
    w = job.work
    argv = ["vllm", "bench", "serve", "--backend", backend, "--model", job.model_ref, "--host", HOST,
            "--port", str(port), "--endpoint", "/v1/completions", "--dataset-name", "random",
            "--random-input-len", str(w.input_len), "--random-output-len", str(w.output_len),
            "--random-range-ratio", "0", "--ignore-eos", "--num-prompts", str(num_prompts(w)),
            *loop_args(job, concurrency_flag="--max-concurrency"),
            "--percentile-metrics", "ttft,tpot,itl,e2el"]
    return Launch(role="benchmark client", argv=tuple(argv))


def sglang_bench(job: ServeJob, *, port: int, max_concurrency: bool, backend: str = "sglang") -> Launch:
    """``python -m sglang.bench_serving`` against ``HOST:port``: random prompts with ``--random-range-ratio 1``
    (lengths drawn from [len x r, len], sglang bench_serving.py sample_random_requests: 1 = exact; the default 0
    halves the mean) and EOS ignored (the client's default; ``--disable-ignore-eos`` turns it off).
    ``max_concurrency``: the client has ``--max-concurrency`` (sgl-project/sglang#2136, 2024-11; not in 0.3.0)."""
    w = job.work
    argv = ["python", "-m", "sglang.bench_serving", "--backend", backend, "--host", HOST, "--port", str(port),
            "--model", job.model_ref, "--dataset-name", "random", "--random-input-len", str(w.input_len),
            "--random-output-len", str(w.output_len), "--random-range-ratio", "1",
            "--num-prompts", str(num_prompts(w)),
            *loop_args(job, concurrency_flag="--max-concurrency" if max_concurrency else None)]
    return Launch(role="benchmark client", argv=tuple(argv))


def bench_file(job: ServeJob, *, client: Launch, target: str, notes: list[str]) -> str:
    """The text of ``bench.sh``: run it once the launch script's servers report ready."""
    lines = header(job=job, target=target, what="benchmark of the planned load", approximations=[])
    return script(header=lines[:-1], launches=[client], notes=notes)
