"""vLLM export: ``vllm serve`` command lines for each replica (or one with ``--data-parallel-size``), prefill and
decode instances joined by a KV connector, and the ``vllm bench serve`` run of the planned load.

Mapping (profile -> flag): kv_memory_fraction -> --gpu-memory-utilization, max_num_seqs -> --max-num-seqs,
max_batched_tokens -> --max-num-batched-tokens, block_size -> --block-size, chunked_prefill ->
--enable-chunked-prefill, cuda_graph_max_batch/step -> --cuda-graph-sizes (0 -> --enforce-eager), multi_step ->
--num-scheduler-steps (0.6.0), custom_allreduce_bytes 0 -> --disable-custom-all-reduce.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from meshplan.export.base import ExportError
from meshplan.export.serve_bench import VLLM_060_CLIENT_NOTE, VLLM_CLIENT, bench_file, vllm_bench
from meshplan.export.serve_common import (
    Launch,
    Pool,
    ServeJob,
    changed_settings,
    checkpoint_notes,
    context_len,
    fits_one_node,
    header,
    pick_release,
    placements,
    port_span,
    replica_nodes,
    script,
    visible_devices,
)
from meshplan.export.serve_dynamo import DYNAMO_FILE, deployment
from meshplan.spec.serving import QUANTIZED


@dataclass(frozen=True, kw_only=True)
class VllmRelease:
    """What one vLLM release's ``vllm serve`` accepts (read from its wheel's parser)."""

    data_parallel: bool
    """``--data-parallel-size``: one command starts every replica behind one API server."""
    expert_parallel: bool
    """``--enable-expert-parallel``."""
    kv_connector: str
    """KV connector for prefill/decode disaggregation via ``--kv-transfer-config`` ("" = none)."""
    multi_step: bool
    """``--num-scheduler-steps`` (V0 multi-step scheduling)."""
    graph_sizes: bool
    """``--cuda-graph-sizes``."""
    block_sizes: tuple[int, ...]
    """``--block-size`` choices."""


# vllm==0.6.0 wheel vllm/engine/arg_utils.py EngineArgs.add_cli_args: --block-size choices [8, 16, 32],
# --num-scheduler-steps; no --data-parallel-size, --enable-expert-parallel or --kv-transfer-config.
# vllm==0.11.0 wheel vllm/engine/arg_utils.py + vllm/config/cache.py (BlockSize 1..128), vllm/config/parallel.py
# (data_parallel_size, enable_expert_parallel), vllm/distributed/kv_transfer/kv_connector/factory.py registers
# NixlConnector; V1 dropped multi-step scheduling.
RELEASES = {
    "0.6.0": VllmRelease(data_parallel=False, expert_parallel=False, kv_connector="", multi_step=True,
                         graph_sizes=False, block_sizes=(8, 16, 32)),
    "0.11.0": VllmRelease(data_parallel=True, expert_parallel=True, kv_connector="NixlConnector", multi_step=False,
                          graph_sizes=True, block_sizes=(1, 8, 16, 32, 64, 128)),
}

PORT = 8000
"""vllm serve's default --port: the endpoint the benchmark uses (a router's when there are several servers)."""

NIXL_PORT = 5557
"""VLLM_NIXL_SIDE_CHANNEL_PORT default (vllm/envs.py 0.11.0); each instance on a node needs its own."""

_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8": "bfloat16", "fp4": "bfloat16",
          "int4": "float16"}


def export(job: ServeJob) -> tuple[dict[str, str], list[str]]:
    """The files of a vLLM export and what vLLM cannot express."""
    version, rel, notes = pick_release(job.engine, RELEASES)
    target = f"vLLM {version} (vllm serve, OpenAI-compatible API server)"
    approx = notes + _approximations(job, rel)
    launches, comments = _launches(job, rel)
    head = header(job=job, target=target, what="serving launch", approximations=approx)
    files = {"launch.sh": script(header=head, launches=launches, notes=comments)}
    if job.disaggregated:
        files[DYNAMO_FILE], more = deployment(job, "vllm", {p.role: engine_args(job, rel, p) for p in job.pools}, head)
        approx += more
    client = vllm_bench(job, backend="vllm", port=PORT)
    bench_notes = [VLLM_060_CLIENT_NOTE] if version == "0.6.0" else []
    files["bench.sh"] = bench_file(job, client=client, target=f"{VLLM_CLIENT} against {target}",
                                   notes=bench_notes + [f"endpoint: http://127.0.0.1:{PORT}"])
    return files, approx


def _approximations(job: ServeJob, rel: VllmRelease) -> list[str]:
    """What the release cannot be told: settings without a flag, expert layouts it cannot make."""
    e, out = job.engine, []
    changed = changed_settings(e)
    if e.multi_step > 1 and not rel.multi_step:
        out.append(f"multi_step={e.multi_step}: this vLLM (V1 engine) has no multi-step scheduling; it streams "
                   "every decode step")
    if e.admission == "reserve":
        out.append("admission 'reserve': vLLM allocates KV blocks as sequences grow (preempting when full), it "
                   "cannot reserve a request's whole output at admission")
    if e.block_size not in rel.block_sizes:
        out.append(f"block_size={e.block_size}: --block-size accepts {list(rel.block_sizes)}; left at vLLM's "
                   "default")
    if not rel.graph_sizes and e.cuda_graph_max_batch and {"cuda_graph_max_batch", "cuda_graph_step"} & changed:
        out.append(f"CUDA graphs to batch {e.cuda_graph_max_batch} in steps of {e.cuda_graph_step}: this vLLM "
                   "captures 1, 2, 4, then multiples of 8 up to its padded max_num_seqs (at most 256), with no "
                   "flag for other sizes")
    if e.custom_allreduce_bytes and "custom_allreduce_bytes" in changed:
        out.append(f"custom all-reduce up to {e.custom_allreduce_bytes:g} bytes: vLLM's size limits are fixed in "
                   "its code (only --disable-custom-all-reduce is a flag)")
    for pool in job.pools:
        out += _expert_notes(job, pool, rel)
        out += _kv_notes(pool)
    return out


def _expert_notes(job: ServeJob, pool: Pool, rel: VllmRelease) -> list[str]:
    p = pool.plan
    if p.ep <= 1:
        return []
    if not job.model.is_moe:
        return [f"{pool.role}: ep={p.ep} on a dense model: nothing to split by expert, ignored"]
    if not rel.expert_parallel:
        return [f"{pool.role}: ep={p.ep}: this vLLM has no --enable-expert-parallel; experts are sharded by tensor "
                f"parallelism over tp={p.tp}"]
    if p.ep != p.moe_group:
        return [f"{pool.role}: ep={p.ep}: --enable-expert-parallel spreads the experts over all {p.moe_group} GPUs "
                "of a replica (tensor x data parallel), not over a subgroup"]
    return []



def _kv_notes(pool: Pool) -> list[str]:
    p = pool.plan
    out = checkpoint_notes(p.precision)
    engine_default = p.precision in QUANTIZED and p.kv_dtype in ("bf16", "fp16")
    if p.kv_dtype == "fp8" or p.kv_dtype == p.precision or engine_default:
        return out
    return out + [f"{pool.role}: KV cache in {p.kv_dtype} with {p.precision} weights: vLLM keeps the KV cache in the "
                  f"model dtype ({_DTYPE[p.precision]}) unless fp8"]


def _check(job: ServeJob, rel: VllmRelease, max_len: int) -> None:
    """Refusals: what this vLLM will not start with."""
    e = job.engine
    if job.disaggregated and not rel.kv_connector:
        raise ExportError(f"vLLM {job.engine.version} has no KV connector (--kv-transfer-config): it cannot run "
                          "prefill and decode on separate instances")
    if rel.multi_step and e.multi_step > 1 and e.chunked_prefill:
        raise ExportError("vLLM 0.6.0 refuses --num-scheduler-steps > 1 with chunked prefill "
                          "(vllm/engine/arg_utils.py create_engine_config)")
    if not e.chunked_prefill and e.max_batched_tokens < max_len:
        raise ExportError(f"max_batched_tokens={e.max_batched_tokens} < max_model_len={max_len} without chunked "
                          "prefill: vLLM's SchedulerConfig refuses a step that cannot hold one whole prompt")


def engine_args(job: ServeJob, rel: VllmRelease, pool: Pool) -> list[str]:
    """The ``vllm serve`` options of one replica of ``pool`` (parallelism, precision, memory and batching)."""
    e, p, max_len = job.engine, pool.plan, context_len(job)
    _check(job, rel, max_len)
    args = ["--tensor-parallel-size", str(p.tp), "--pipeline-parallel-size", str(p.pp),
            "--dtype", _DTYPE[p.precision]]
    if p.precision == "fp8":
        args += ["--quantization", "fp8"]  # online dynamic FP8 from a 16-bit checkpoint, or the checkpoint's own
    if p.kv_dtype == "fp8":
        args += ["--kv-cache-dtype", "fp8"]
    if p.attn_dp > 1:  # data-parallel attention: one engine core and KV cache per rank, MoE over all of them
        args += ["--data-parallel-size", str(p.attn_dp)]
    if p.ep > 1 and job.model.is_moe and rel.expert_parallel:
        args += ["--enable-expert-parallel"]
    args += ["--max-model-len", str(max_len), "--gpu-memory-utilization", f"{e.kv_memory_fraction:g}",
             "--max-num-seqs", str(e.max_num_seqs), "--max-num-batched-tokens", str(e.max_batched_tokens)]
    if e.block_size in rel.block_sizes:
        args += ["--block-size", str(e.block_size)]
    if rel.graph_sizes:  # V1: a boolean flag pair; 0.6.0: --enable-chunked-prefill [true|false]
        args += ["--enable-chunked-prefill" if e.chunked_prefill else "--no-enable-chunked-prefill"]
    else:
        args += ["--enable-chunked-prefill", "true" if e.chunked_prefill else "false"]
    if rel.multi_step:
        args += ["--num-scheduler-steps", str(e.multi_step)]
    args += _graph_args(e.cuda_graph_max_batch, e.cuda_graph_step, rel)
    if e.custom_allreduce_bytes == 0:
        args += ["--disable-custom-all-reduce"]
    if replica_nodes(pool) > 1:
        args += ["--distributed-executor-backend", "ray"]
    return args + _speculative_args(p)


def _speculative_args(p) -> list[str]:
    """``--speculative-config`` (vllm@v0.11.0 vllm/config/speculative.py): an EAGLE head is ``eagle3`` when its
    checkpoint's name says so, else ``eagle`` (stated, not left to vLLM's guess from the name, which would read
    any other name as a draft model its V1 engine refuses); MTP drafts with the model's own module, n-gram lookup
    with vLLM's default window (prompt_lookup_min = max = 5)."""
    spec = p.speculation
    if spec is None:
        return []
    conf: dict = {"num_speculative_tokens": spec.draft_tokens}
    if spec.method in ("mtp", "ngram"):
        conf["method"] = spec.method
    else:
        conf |= {"method": "eagle3" if "eagle3" in spec.checkpoint.lower() else "eagle", "model": spec.checkpoint}
    return ["--speculative-config", json.dumps(conf, separators=(",", ":"))]


def _graph_args(max_batch: int, step: int, rel: VllmRelease) -> list[str]:
    """CUDA-graph capture sizes: one value N means [1, 2, 4] + range(8, N + 1, 8) (vllm/config/__init__.py 0.11.0
    VllmConfig), else the full list the profile's graph_batch pads to; 0 = no graphs (--enforce-eager)."""
    if max_batch == 0:
        return ["--enforce-eager"]
    if not rel.graph_sizes:
        return []
    if step == 8:
        return ["--cuda-graph-sizes", str(max_batch)]
    sizes = sorted({s for s in (1, 2, 4) if s <= max_batch} | set(range(step, max_batch + 1, step)) | {max_batch})
    return ["--cuda-graph-sizes", *[str(s) for s in sizes]]


def _launches(job: ServeJob, rel: VllmRelease) -> tuple[list[Launch], list[str]]:
    """Commands and the comments that go with them."""
    places = placements(job)
    if job.disaggregated:
        return _disaggregated(job, rel, places)
    pool = job.pools[0]
    base = ["vllm", "serve", job.model_ref]
    # vLLM's data-parallel ranks of a MoE model share their expert layers (a DP x TP group): independent
    # replicas of one are separate servers; --data-parallel-size is a MoE plan's data-parallel attention
    if pool.replicas > 1 and rel.data_parallel and fits_one_node(job) and not job.model.is_moe:
        gpus = sorted({g for _, gs in places["serve"] for g in gs})
        argv = base + ["--port", str(PORT), *engine_args(job, rel, pool), "--data-parallel-size", str(pool.replicas)]
        return [Launch(role=f"{pool.replicas} replicas (--data-parallel-size)", argv=tuple(argv),
                       env=(visible_devices(gpus),))], []
    launches, notes = [], []
    ports = [PORT] if pool.replicas == 1 else [PORT + 1 + i for i in range(pool.replicas)]
    for i, ((node, gpus), port) in enumerate(zip(places["serve"], ports)):
        argv = base + ["--port", str(port), *engine_args(job, rel, pool)]
        launches.append(Launch(role=f"replica {i}", argv=tuple(argv), env=(visible_devices(gpus),), node=node))
    if pool.replicas > 1:
        span = port_span(ports[0], len(ports))
        why = ("this vLLM has no data parallelism of its own" if not rel.data_parallel else
               "--data-parallel-size is written only for a dense model whose replicas all fit one node: a MoE "
               "model's data-parallel ranks share their experts")
        notes.append(f"{pool.replicas} replicas on ports {span}: put a round-robin load balancer on port {PORT} in "
                     f"front of them ({why}; e.g. an nginx upstream or vllm-project/production-stack's router)")
    if replica_nodes(pool) > 1:
        notes.append(f"each replica spans {replica_nodes(pool)} nodes: start a Ray cluster over them and run its "
                     "command on the Ray head node")
    return launches, notes


def _disaggregated(job: ServeJob, rel: VllmRelease, places: dict) -> tuple[list[Launch], list[str]]:
    """Prefill and decode instances with the release's KV connector (both kv_both: the connector moves KV from the
    instance that prefilled to the one that decodes, vLLM docs/features/disagg_prefill and nixl_connector_usage)."""
    kv = json.dumps({"kv_connector": rel.kv_connector, "kv_role": "kv_both"}, separators=(",", ":"))
    launches, per_node = [], {}
    for pool, base_port in zip(job.pools, (PORT + 100, PORT + 200)):
        for i, (node, gpus) in enumerate(places[pool.role]):
            side = NIXL_PORT + per_node.get(node, 0)
            per_node[node] = per_node.get(node, 0) + 1
            argv = ["vllm", "serve", job.model_ref, "--port", str(base_port + i), *engine_args(job, rel, pool),
                    "--kv-transfer-config", kv]
            env = (visible_devices(gpus), ("VLLM_NIXL_SIDE_CHANNEL_PORT", str(side)))
            launches.append(Launch(role=f"{pool.role} {i}", argv=tuple(argv), env=env, node=node))
    prefill, decode = job.pools
    notes = [f"prefill on port(s) {port_span(PORT + 100, prefill.replicas)}, decode on "
             f"{port_span(PORT + 200, decode.replicas)}: a proxy on port {PORT} must send each request to a prefill "
             "instance (max_tokens=1, kv_transfer_params do_remote_decode) and then to a decode instance with the "
             "returned kv_transfer_params; vLLM ships only a test one (tests/v1/kv_connector/nixl_integration/"
             "toy_proxy_server.py); for production, dynamo_disagg.yaml deploys the same pools under NVIDIA Dynamo"]
    return launches, notes
