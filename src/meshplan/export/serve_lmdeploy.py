"""LMDeploy export: one ``lmdeploy serve api_server`` per replica on the TurboMind backend, and the
``vllm bench serve`` run of the planned load against its OpenAI-compatible ``/v1/completions``.

Mapping (profile -> flag, lmdeploy@v0.16.0 lmdeploy/cli/serve.py and cli/utils.py ArgumentHelper): tp -> --tp,
kv_memory_fraction -> --cache-max-entry-count, block_size -> --cache-block-seq-len, max_num_seqs ->
--max-batch-size, activation_tokens -> --max-prefill-token-num (TurboMind's step budget is that plus the batch),
int8 or int4 KV -> --quant-policy; fp8 and int4 weights -> --model-format fp8 / awq.
"""

from __future__ import annotations

from meshplan.export.base import ExportError
from meshplan.export.serve_bench import VLLM_CLIENT, bench_file, vllm_bench
from meshplan.export.serve_common import (
    Launch,
    ServeJob,
    checkpoint_notes,
    context_len,
    header,
    pick_release,
    replica_launches,
    replica_nodes,
    script,
)

RELEASES = {"0.16.0": None}
"""The release whose api_server options the export writes (lmdeploy@v0.16.0)."""
PORT = 23333
"""api_server's effective default --server-port."""
_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp8": "bfloat16", "int4": "float16"}
_FORMAT = {"fp8": "fp8", "int4": "awq"}
"""--model-format of a quantized checkpoint (TurboMind forces fp16 activations for AWQ: turbomind/converter.py)."""


def export(job: ServeJob) -> tuple[dict[str, str], list[str]]:
    """The files of an LMDeploy export and what it cannot express."""
    version, _, notes = pick_release(job.engine, RELEASES)
    _check(job)
    target = f"LMDeploy {version} (lmdeploy serve api_server, TurboMind)"
    approx = notes + _approximations(job)
    launches, comments = _launches(job)
    head = header(job=job, target=target, what="serving launch", approximations=approx)
    files = {"launch.sh": script(header=head, launches=launches, notes=comments)}
    client = vllm_bench(job, backend="openai", port=PORT)
    files["bench.sh"] = bench_file(job, client=client, target=f"{VLLM_CLIENT} against {target}",
                                   notes=[f"endpoint: http://127.0.0.1:{PORT}/v1/completions"])
    return files, approx


def _check(job: ServeJob) -> None:
    """Refusals: layouts TurboMind cannot start beyond the profile's own (``serve_common.profile_refusals``)."""
    p = job.plan
    if p.precision == "fp4":
        raise ExportError("fp4 weights: TurboMind's --model-format has no NVFP4 (hf, awq, gptq, fp8, mxfp4)")
    if replica_nodes(job.pools[0]) > 1:
        raise ExportError(f"tp={p.tp} spans nodes: meshplan writes one api_server per replica on one node")


def _approximations(job: ServeJob) -> list[str]:
    """What TurboMind cannot be told."""
    e, p, out = job.engine, job.plan, []
    if p.kv_dtype == "fp8":
        out.append("fp8 KV cache: TurboMind rejects fp8 KV ('FP8 quantization is not supported'); written as int8 "
                   "KV (--quant-policy 8), the same bytes per token")
    if e.admission == "reserve":
        out.append("admission 'reserve': TurboMind allocates blocks as sequences grow and evicts by recompute")
    if e.cuda_graph_max_batch:
        out.append(f"CUDA graphs to batch {e.cuda_graph_max_batch}: TurboMind captures none")
    if e.custom_allreduce_bytes:
        out.append("custom all-reduce: written as NCCL, TurboMind's default communicator (--communicator cuda-ipc "
                   "selects its own kernels)")
    if p.precision == "fp8":
        out.append("fp8 weights: MODEL must be an FP8 checkpoint (--model-format fp8 reads blocked-FP8 weights; "
                   "TurboMind does not quantize a 16-bit checkpoint on load)")
    if not e.mixed_batches or not e.chunked_prefill:
        out.append("prefill apart from the decodes: TurboMind always splits and fuses prompts into the decode steps")
    return out + checkpoint_notes(p.precision)


def engine_args(job: ServeJob) -> list[str]:
    """The api_server options of one replica."""
    e, p = job.engine, job.plan
    args = ["--backend", "turbomind", "--tp", str(p.tp), "--dtype", _DTYPE[p.precision]]
    if p.precision in _FORMAT:
        args += ["--model-format", _FORMAT[p.precision]]
    if p.kv_dtype == "fp8":
        args += ["--quant-policy", "8"]
    args += ["--session-len", str(context_len(job)), "--max-batch-size", str(e.max_num_seqs),
             "--cache-max-entry-count", f"{e.kv_memory_fraction:g}", "--cache-block-seq-len", str(e.block_size),
             "--max-prefill-token-num", str(e.activation_tokens)]
    return args


def _launches(job: ServeJob) -> tuple[list[Launch], list[str]]:
    """One api_server per replica on its GPUs; a load balancer in front when there are several."""
    return replica_launches(
        job, port=PORT, balancer="or LMDeploy's own `lmdeploy serve proxy`",
        argv=lambda i, port: ["lmdeploy", "serve", "api_server", job.model_ref, "--server-port", str(port),
                              *engine_args(job)])
