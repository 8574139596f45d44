"""TensorRT-LLM export: ``trtllm-serve`` command lines, the ``extra_llm_api_options.yaml`` LLM-API options they
read (1.x), context and generation servers behind ``trtllm-serve disaggregated`` (1.x), and a ``vllm bench serve``
run of the planned load against the OpenAI endpoint.

Mapping (profile -> option): max_num_seqs -> --max_batch_size, max_batched_tokens -> --max_num_tokens,
kv_memory_fraction -> --kv_cache_free_gpu_memory_fraction and kv_cache_config.free_gpu_memory_fraction,
block_size -> kv_cache_config.tokens_per_block, chunked_prefill -> enable_chunked_prefill, cuda_graph_max_batch/step
-> cuda_graph_config.batch_sizes (padded; 0 -> null), admission -> scheduler_config.capacity_scheduler_policy,
custom_allreduce_bytes 0 -> allreduce_strategy NCCL. Field names: NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py
(BaseLlmArgs, TorchLlmArgs, KvCacheConfig, CudaGraphConfig, CacheTransceiverConfig; all StrictBaseModel, unknown
keys refused); flags: tensorrt_llm/commands/serve.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.export.base import ExportError
from meshplan.export.serve_bench import VLLM_CLIENT, bench_file, vllm_bench
from meshplan.export.serve_common import (
    HOST,
    Launch,
    Pool,
    ServeJob,
    changed_settings,
    checkpoint_notes,
    context_len,
    header,
    pick_release,
    placements,
    port_span,
    replica_nodes,
    script,
    to_yaml,
    visible_devices,
)
from meshplan.export.serve_dynamo import DYNAMO_FILE, deployment
from meshplan.spec.serving import QUANTIZED


@dataclass(frozen=True, kw_only=True)
class TrtllmRelease:
    """What one TensorRT-LLM release's ``trtllm-serve`` accepts."""

    llm_api_yaml: bool
    """``--extra_llm_api_options FILE`` (LLM-API options as YAML) and the PyTorch backend (``--backend pytorch``)."""
    disaggregation: bool
    """``trtllm-serve disaggregated -c FILE`` with context/generation servers."""


# 0.17: the first trtllm-serve (stored NVIDIA/TensorRT-LLM tensorrt_llm/commands/serve.py with LlmArgs.from_kwargs:
# MODEL --tokenizer --host --port --backend [pytorch] --max_beam_width --max_batch_size --max_num_tokens
# --max_seq_len --tp_size --pp_size --ep_size --gpus_per_node --kv_cache_free_gpu_memory_fraction
# --trust_remote_code; TensorRT engine path unless --backend pytorch). 1.2: serve.py @00209af1 adds
# --extra_llm_api_options/--config, PyTorch backend by default, and the disaggregated command.
RELEASES = {
    "0.17": TrtllmRelease(llm_api_yaml=False, disaggregation=False),
    "1.2": TrtllmRelease(llm_api_yaml=True, disaggregation=True),
}

HARNESSES = {
    "nim": "an NVIDIA NIM container (configured by NIM_* environment variables and its own profiles)",
    "mlperf": "NVIDIA's MLPerf harness (its configs/ Python files)",
}
"""Profile-name prefixes of TensorRT-LLM harnesses whose version is the harness's, not TensorRT-LLM's."""

PORT = 8000
"""trtllm-serve's default --port: the endpoint the benchmark uses (the disaggregated router's when split)."""

YAML = "extra_llm_api_options.yaml"
"""The LLM-API options file one server reads."""

_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def export(job: ServeJob) -> tuple[dict[str, str], list[str]]:
    """The files of a TensorRT-LLM export and what trtllm-serve cannot express."""
    for prefix, what in HARNESSES.items():
        if job.engine.name.startswith(prefix):
            raise ExportError(f"engine profile {job.engine.name} is {what}, not a trtllm-serve release: export with "
                              "--engine trtllm (or trtllm-0.17) instead")
    version, rel, notes = pick_release(job.engine, RELEASES)
    if job.disaggregated and not rel.disaggregation:
        raise ExportError(f"TensorRT-LLM {version}'s trtllm-serve has no disaggregated mode")
    target = (f"TensorRT-LLM {version} (trtllm-serve, PyTorch backend)" if rel.llm_api_yaml else
              f"TensorRT-LLM {version} (trtllm-serve, TensorRT engine built from the checkpoint at start)")
    approx = notes + _approximations(job, rel)
    head = header(job=job, target=target, what="serving launch", approximations=approx)
    files: dict[str, str] = {}
    launches, comments = _launches(job, rel, files, head)
    files["launch.sh"] = script(header=head, launches=launches, notes=comments)
    if job.disaggregated:
        files[DYNAMO_FILE], more = deployment(job, "trtllm", {p.role: dynamo_args(job, p) for p in job.pools}, head)
        approx += more
    client = vllm_bench(job, backend="openai", port=PORT)
    files["bench.sh"] = bench_file(job, client=client, target=f"{VLLM_CLIENT} against {target}", notes=[
        f"endpoint: http://{HOST}:{PORT}/v1/completions (trtllm-serve's OpenAI API; its CompletionRequest takes "
        "ignore_eos); TensorRT-LLM's own tensorrt_llm/serve/scripts/benchmark_serving.py is vLLM-derived"])
    return files, approx


def _approximations(job: ServeJob, rel: TrtllmRelease) -> list[str]:
    e, out, changed = job.engine, [], changed_settings(job.engine)
    if e.multi_step > 1:
        out.append(f"multi_step={e.multi_step}: TensorRT-LLM schedules every decode step (stream_interval only "
                   "batches the streamed chunks)")
    if not rel.llm_api_yaml:
        out += _cli_only(job, changed)
    elif e.custom_allreduce_bytes and "custom_allreduce_bytes" in changed:
        out.append(f"custom all-reduce up to {e.custom_allreduce_bytes:g} bytes: allreduce_strategy AUTO picks by "
                   "its own table; only a fixed strategy can be named")
    for pool in job.pools:
        p = pool.plan
        if p.ep > 1 and not job.model.is_moe:
            out.append(f"{pool.role}: ep={p.ep} on a dense model: nothing to split by expert, ignored")
        out += [f"{pool.role}: {n}" for n in checkpoint_notes(p.precision)]
        if p.precision == "fp8" and p.kv_dtype != "fp8" and e.fp8_kv:
            out.append(f"{pool.role}: {p.kv_dtype} KV with fp8 weights: TensorRT-LLM's FP8 checkpoints usually "
                       "carry an FP8 KV cache (kv_cache_quant_algo), which the checkpoint, not a flag, decides")
    return out


def _cli_only(job: ServeJob, changed: set[str]) -> list[str]:
    """What the first trtllm-serve (no LLM-API YAML) cannot be told: everything past its nine flags."""
    e, out = job.engine, []
    if e.chunked_prefill:
        out.append("chunked prefill: this trtllm-serve has no option for it (the LLM API default, off, runs)")
    if e.admission == "lazy":
        out.append("admission 'lazy' (MAX_UTILIZATION): this trtllm-serve runs the LLM API default "
                   "GUARANTEED_NO_EVICT, with no option to change it")
    if e.cuda_graph_max_batch:
        out.append(f"CUDA graphs to batch {e.cuda_graph_max_batch}: the TensorRT engine path runs without them "
                   "here (cuda_graph_mode is a build/runtime knob trtllm-serve does not expose)")
    if "block_size" in changed:
        out.append(f"block_size={e.block_size}: tokens_per_block is an engine-build setting trtllm-serve does not "
                   "expose")
    for pool in job.pools:
        p = pool.plan
        if p.kv_dtype == "fp8" or p.precision == "fp8":
            out.append(f"{pool.role}: fp8 {'weights' if p.precision == 'fp8' else 'KV cache'}: this trtllm-serve "
                       "has no quantization option; the checkpoint must already be FP8-quantized (quantize.py "
                       "--qformat fp8 --kv_cache_dtype fp8)")
    return out


def serve_args(job: ServeJob, rel: TrtllmRelease, pool: Pool, *, yaml_name: str) -> list[str]:
    """The ``trtllm-serve`` options of one server of ``pool``."""
    e, p = job.engine, pool.plan
    args = ["--backend", "pytorch"] if rel.llm_api_yaml else []
    # under enable_attention_dp the tp ranks run attention data-parallel and the MoE over all of them
    args += ["--tp_size", str(p.moe_group), "--pp_size", str(p.pp)]
    if p.ep > 1 and job.model.is_moe:
        args += ["--ep_size", str(p.ep)]
    args += ["--max_batch_size", str(e.max_num_seqs), "--max_num_tokens", str(e.max_batched_tokens),
             "--max_seq_len", str(context_len(job)), "--kv_cache_free_gpu_memory_fraction",
             f"{e.kv_memory_fraction:g}"]
    if rel.llm_api_yaml:
        args += ["--extra_llm_api_options", yaml_name]
    return args


def dynamo_args(job: ServeJob, pool: Pool) -> list[str]:
    """dynamo.trtllm's options of one worker of ``pool`` (ai-dynamo/dynamo 0.6.1 components/src/dynamo/trtllm
    argument parser: the layout and sizes as flags, the rest in the pool's LLM-API file)."""
    e, p = job.engine, pool.plan
    args = ["--tensor-parallel-size", str(p.moe_group), "--pipeline-parallel-size", str(p.pp)]
    if p.ep > 1 and job.model.is_moe:
        args += ["--expert-parallel-size", str(p.ep)]
    return args + ["--kv-block-size", str(e.block_size), "--max-batch-size", str(e.max_num_seqs),
                   "--max-num-tokens", str(e.max_batched_tokens), "--max-seq-len", str(context_len(job)),
                   "--free-gpu-memory-fraction", f"{e.kv_memory_fraction:g}",
                   "--extra-engine-args", f"extra_llm_api_options.{pool.role}.yaml"]


def graph_sizes(max_batch: int, step: int) -> list[int]:
    """Captured decode batch sizes: 1, 2, 4, then multiples of ``step`` up to ``max_batch`` (EngineProfile
    .graph_batch pads to these)."""
    return sorted({s for s in (1, 2, 4) if s <= max_batch} | set(range(step, max_batch + 1, step)) | {max_batch})


def llm_api_options(job: ServeJob, pool: Pool) -> dict:
    """The LLM-API options of one server of ``pool`` (keys of TorchLlmArgs)."""
    e, p = job.engine, pool.plan
    kv = {"free_gpu_memory_fraction": e.kv_memory_fraction, "tokens_per_block": e.block_size,
          "dtype": "fp8" if p.kv_dtype == "fp8" else "auto"}
    graphs = ({"batch_sizes": graph_sizes(e.cuda_graph_max_batch, e.cuda_graph_step), "enable_padding": True}
              if e.cuda_graph_max_batch else None)
    policy = "GUARANTEED_NO_EVICT" if e.admission == "reserve" else "MAX_UTILIZATION"
    opts = {"kv_cache_config": kv, "enable_chunked_prefill": e.chunked_prefill, "cuda_graph_config": graphs,
            "scheduler_config": {"capacity_scheduler_policy": policy}}
    if p.precision not in QUANTIZED:  # a quantized checkpoint's dtype stays auto: its config decides
        opts["dtype"] = _DTYPE[p.precision]
    if e.custom_allreduce_bytes == 0:
        opts["allreduce_strategy"] = "NCCL"
    if p.attn_dp > 1:  # TorchLlmArgs.enable_attention_dp: attention data-parallel over the tp ranks
        opts["enable_attention_dp"] = True
    if pool.role != "serve":
        opts["cache_transceiver_config"] = {"backend": "DEFAULT"}
    if p.speculation is not None:
        opts["speculative_config"] = speculative_config(p.speculation)
    return opts


def speculative_config(spec) -> dict:
    """The LLM-API ``speculative_config`` (NVIDIA/TensorRT-LLM 1.x tensorrt_llm/llmapi/llm_args.py: decoding_type
    MTP with num_nextn_predict_layers; Eagle / Eagle3, NGram, Draft_Target with max_draft_len; the draft weights
    as DecodingBaseConfig.speculative_model, alias speculative_model_dir): k drafts a pass. An EAGLE head is Eagle3
    when its checkpoint's name says so, as vLLM and SGLang read it."""
    if spec.method == "mtp":
        return {"decoding_type": "MTP", "num_nextn_predict_layers": spec.draft_tokens}
    eagle = "Eagle3" if "eagle3" in spec.checkpoint.lower() else "Eagle"
    conf = {"decoding_type": {"eagle": eagle, "ngram": "NGram", "draft": "Draft_Target"}[spec.method],
            "max_draft_len": spec.draft_tokens}
    if spec.checkpoint:
        conf["speculative_model_dir"] = spec.checkpoint
    return conf


def _yaml_file(head: list[str], what: str, body: dict) -> str:
    lines = [f"# {h}".rstrip() for h in [what, *head[1:]]]
    return "\n".join(lines + to_yaml(body)) + "\n"


def _server(job: ServeJob, rel: TrtllmRelease, pool: Pool, spot: tuple, *, role: str, port: int,
            yaml_name: str) -> Launch:
    node, gpus = spot
    argv = ["trtllm-serve", job.model_ref, "--host", "0.0.0.0", "--port", str(port),
            *serve_args(job, rel, pool, yaml_name=yaml_name)]
    if replica_nodes(pool) > 1:  # one MPI world over the replica's nodes (docs: trtllm-llmapi-launch under mpirun)
        argv = ["mpirun", "-n", str(pool.plan.gpus_per_replica), "trtllm-llmapi-launch", *argv]
    return Launch(role=role, argv=tuple(argv), env=(visible_devices(gpus),), node=node)


def _launches(job: ServeJob, rel: TrtllmRelease, files: dict, head: list[str]) -> tuple[list[Launch], list[str]]:
    """Commands (and the YAML files they read, added to ``files``) with their comments."""
    places, launches, notes = placements(job), [], []
    if replica_nodes(job.pools[0]) > 1 or any(replica_nodes(p) > 1 for p in job.pools):
        notes.append("servers larger than a node run under mpirun over their nodes (give mpirun a hostfile)")
    if rel.llm_api_yaml and any(p.plan.precision == "fp8" for p in job.pools):
        notes.append("fp8 weights: MODEL must be an FP8-quantized checkpoint (NVIDIA ModelOpt FP8): the PyTorch "
                     "backend takes its quantization from the checkpoint's config, it does not quantize online")
    if not job.disaggregated:
        pool = job.pools[0]
        if rel.llm_api_yaml:
            files[YAML] = _yaml_file(head, "trtllm-serve LLM-API options, generated by meshplan",
                                     llm_api_options(job, pool))
        ports = [PORT] if pool.replicas == 1 else [PORT + 1 + i for i in range(pool.replicas)]
        for i, (spot, port) in enumerate(zip(places["serve"], ports)):
            launches.append(_server(job, rel, pool, spot, role=f"replica {i}", port=port, yaml_name=YAML))
        if pool.replicas > 1:
            span = port_span(ports[0], len(ports))
            notes.append(f"{pool.replicas} replicas on ports {span}: trtllm-serve has no router for independent "
                         f"replicas; put a round-robin load balancer on port {PORT} in front of them")
        return launches, notes
    urls = {}
    for pool, base_port in zip(job.pools, (PORT + 100, PORT + 200)):
        name = f"extra_llm_api_options.{pool.role}.yaml"
        files[name] = _yaml_file(head, f"trtllm-serve LLM-API options of the {pool.role} servers, generated by "
                                       "meshplan", llm_api_options(job, pool))
        urls[pool.role] = [f"{HOST}:{base_port + i}" for i in range(pool.replicas)]
        for i, spot in enumerate(places[pool.role]):
            launches.append(_server(job, rel, pool, spot, role=f"{pool.role} {i}", port=base_port + i,
                                    yaml_name=name))
    files["disagg_config.yaml"] = _yaml_file(head, "trtllm-serve disaggregated config, generated by meshplan", {
        "hostname": "0.0.0.0", "port": PORT, "backend": "pytorch",
        "context_servers": {"num_instances": len(urls["prefill"]), "urls": urls["prefill"]},
        "generation_servers": {"num_instances": len(urls["decode"]), "urls": urls["decode"]}})
    launches.append(Launch(role="disaggregated router (context then generation server per request)",
                           argv=("trtllm-serve", "disaggregated", "-c", "disagg_config.yaml")))
    notes.append("disagg_config.yaml: keys of tensorrt_llm/llmapi/disagg_utils.py extract_disagg_cfg (context_servers"
                 " / generation_servers with num_instances and urls)")
    return launches, notes
