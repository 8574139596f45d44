"""Hugging Face TGI export: one ``text-generation-launcher`` per replica (TGI has no data parallelism of its own),
and the ``vllm bench serve`` run of the planned load against its OpenAI-compatible ``/v1/completions``.

Mapping (profile -> flag, tgi@v3.3.7 and v2.4.1 launcher/src/main.rs): tp -> --num-shard, a lowered
max_num_seqs -> --max-batch-size (TGI 2; TGI 3 ignores it under prefill chunking), max_batched_tokens ->
--max-batch-prefill-tokens, cuda_graph_max_batch/step -> --cuda-graphs (0 -> "0"),
kv_memory_fraction -> --cuda-memory-fraction (the profile's fraction is CUDA_MEMORY_FRACTION x the 0.90
TGI_WIGGLE_ROOM), fp8 KV -> --kv-cache-dtype fp8_e4m3fn. --max-concurrent-requests (128 by default; the router
refuses requests beyond it with 429) is raised to the benchmark's requests. Shards of replicas sharing a node get
their own socket path and NCCL port (--shard-uds-path, --master-port).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.cost.serve_sizing import TGI_WIGGLE_ROOM
from meshplan.export.base import ExportError
from meshplan.export.serve_bench import VLLM_CLIENT, bench_file, vllm_bench
from meshplan.export.serve_common import (
    Launch,
    ServeJob,
    changed_settings,
    checkpoint_notes,
    context_len,
    header,
    num_prompts,
    pick_release,
    replica_launches,
    replica_nodes,
    script,
)


@dataclass(frozen=True, kw_only=True)
class TgiRelease:
    """What one TGI release's launcher does with the flags meshplan writes."""

    chunking: bool
    """Prefill chunking on by default (PREFILL_CHUNKING), so a prompt may exceed --max-batch-prefill-tokens and the
    router ignores --max-batch-size (backends/v3/src/backend.rs: max_size None under chunking)."""


RELEASES = {"2.4.1": TgiRelease(chunking=False), "3.3.7": TgiRelease(chunking=True)}
"""tgi@v2.4.1 and @v3.3.7: PREFILL_CHUNKING default '0' then '1' (#2797); backends/v3/src/main.rs refuses
max_input_tokens > max_batch_prefill_tokens without chunking."""

PORT = 8080
"""The port the benchmark reaches (the launcher's default --port is 3000; meshplan writes 8080 and up)."""
ROUTER_CAP = 128
"""--max-concurrent-requests default: requests in flight beyond it are refused with 429 (router/src/infer/mod.rs)."""
MASTER_PORT = 29500
"""--master-port default: the shards' torch.distributed rendezvous, one per replica on a node."""
_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}
_QUANTIZE = {"fp8": "fp8", "int4": "awq"}


def export(job: ServeJob) -> tuple[dict[str, str], list[str]]:
    """The files of a TGI export and what TGI cannot express."""
    version, rel, notes = pick_release(job.engine, RELEASES)
    _check(job, rel)
    target = f"Hugging Face TGI {version} (text-generation-launcher)"
    approx = notes + _approximations(job, rel)
    launches, comments = _launches(job, rel)
    head = header(job=job, target=target, what="serving launch", approximations=approx)
    files = {"launch.sh": script(header=head, launches=launches, notes=comments)}
    client = vllm_bench(job, backend="openai", port=PORT)
    files["bench.sh"] = bench_file(job, client=client, target=f"{VLLM_CLIENT} against {target}",
                                   notes=[f"endpoint: http://127.0.0.1:{PORT}/v1/completions"])
    return files, approx


def _check(job: ServeJob, rel: TgiRelease) -> None:
    """Refusals: layouts TGI cannot start beyond the profile's own (``serve_common.profile_refusals``)."""
    p = job.plan
    if p.precision == "fp4":
        raise ExportError("fp4 weights: TGI's --quantize has no NVFP4 (awq, gptq, marlin, fp8, bitsandbytes...)")
    if replica_nodes(job.pools[0]) > 1:
        raise ExportError(f"tp={p.tp} spans nodes: TGI's shards run on one machine (one launcher per node)")
    longest_prompt = max(n for n, _ in job.work.bins("input"))
    if not rel.chunking and job.engine.max_batched_tokens < longest_prompt:
        raise ExportError(f"max_batched_tokens={job.engine.max_batched_tokens} < the {longest_prompt}-token prompt: "
                          "TGI without prefill chunking refuses max_input_tokens > max_batch_prefill_tokens")


def _approximations(job: ServeJob, rel: TgiRelease) -> list[str]:
    """What TGI cannot be told."""
    e, p, out = job.engine, job.plan, []
    changed = changed_settings(e)
    if rel.chunking and _capped(e):
        out.append(f"max_num_seqs={e.max_num_seqs}: TGI 3 batches what the KV blocks admit; its router ignores "
                   "--max-batch-size under prefill chunking")
    if e.admission == "lazy":
        out.append("admission 'lazy': TGI's router reserves blocks for the prompt and max_new_tokens at admission")
    if e.block_size not in (1, 16, 256):
        out.append(f"block_size={e.block_size}: TGI's page size follows its attention backend (flashinfer 1, paged "
                   "16, flashdecoding 256)")
    if e.cuda_graph_step != 8 and "cuda_graph_step" in changed:
        out.append(f"CUDA graphs in steps of {e.cuda_graph_step}: written as the sizes the profile pads to")
    if p.ep > 1:
        out.append(f"ep={p.ep}: TGI shards the experts by tensor parallelism over tp={p.tp}")
    if p.kv_dtype == "fp16" and p.precision == "bf16":
        out.append("KV cache in fp16 with bf16 weights: TGI keeps the KV cache in the model dtype unless fp8")
    return out + checkpoint_notes(p.precision)


def _capped(engine) -> bool:
    """Whether the running-sequence cap is below the profile's stand-in for none (the search's lower caps)."""
    from meshplan import catalog

    return engine.max_num_seqs < catalog.engine(engine.name).max_num_seqs


def engine_args(job: ServeJob, replica: int, rel: TgiRelease) -> list[str]:
    """The launcher options of one replica (parallelism, precision, memory, batching; its own socket and port)."""
    e, p, max_len = job.engine, job.plan, context_len(job)
    args = ["--num-shard", str(p.tp)]
    # --dtype or --quantize, not both: text_generation_server/cli.py serve() refuses the pair (but bitsandbytes)
    args += ["--quantize", _QUANTIZE[p.precision]] if p.precision in _QUANTIZE else ["--dtype", _DTYPE[p.precision]]
    if p.kv_dtype == "fp8":
        args += ["--kv-cache-dtype", "fp8_e4m3fn"]
    longest_prompt = max(n for n, _ in job.work.bins("input"))
    args += ["--max-input-tokens", str(min(longest_prompt, max_len - 1)), "--max-total-tokens", str(max_len),
             "--max-batch-prefill-tokens", str(e.max_batched_tokens),
             "--max-concurrent-requests", str(max(ROUTER_CAP, num_prompts(job.work)))]
    if _capped(e) and not rel.chunking:
        args += ["--max-batch-size", str(e.max_num_seqs)]
    if "kv_memory_fraction" in changed_settings(e):
        args += ["--cuda-memory-fraction", f"{min(e.kv_memory_fraction / TGI_WIGGLE_ROOM, 1.0):.4g}"]
    args += ["--cuda-graphs", _graphs(e.cuda_graph_max_batch, e.cuda_graph_step)]
    if replica:
        args += ["--shard-uds-path", f"/tmp/text-generation-server-{replica}",
                 "--master-port", str(MASTER_PORT + replica)]
    return args


def _graphs(max_batch: int, step: int) -> str:
    """--cuda-graphs: the captured sizes the profile pads a decode batch to (1, 2, 4, then multiples of the step:
    1,2,4,8,16,24,32 for TGI's 32, whose own default list lacks 24), "0" for none."""
    if max_batch == 0:
        return "0"
    sizes = sorted({s for s in (1, 2, 4) if s <= max_batch} | set(range(step, max_batch + 1, step)) | {max_batch})
    return ",".join(str(s) for s in sizes)


def _launches(job: ServeJob, rel: TgiRelease) -> tuple[list[Launch], list[str]]:
    """One launcher per replica on its GPUs; a load balancer in front when there are several."""
    return replica_launches(
        job, port=PORT, balancer="TGI has no data parallelism of its own",
        argv=lambda i, port: ["text-generation-launcher", "--model-id", job.model_ref, "--port", str(port),
                              *engine_args(job, i, rel)])
