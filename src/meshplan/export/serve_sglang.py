"""SGLang export: ``python -m sglang.launch_server`` command lines (one with ``--dp-size`` when every replica fits
one node, else one per replica and per node), prefill and decode servers (``--disaggregation-mode``) behind
sglang-router, and the ``python -m sglang.bench_serving`` run of the planned load.

Mapping (profile -> flag): kv_memory_fraction -> --mem-fraction-static, max_num_seqs -> --max-running-requests,
max_batched_tokens -> --chunked-prefill-size (-1 = no chunking) and --max-prefill-tokens, block_size ->
--page-size (0.5), cuda_graph_max_batch -> --cuda-graph-max-bs-decode (0.5; 0 -> --disable-cuda-graph),
custom_allreduce_bytes 0 -> --disable-custom-all-reduce.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.export.base import ExportError
from meshplan.export.serve_bench import bench_file, sglang_bench
from meshplan.export.serve_common import (
    HOST,
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
class SglangRelease:
    """What one SGLang release's ``launch_server`` and ``bench_serving`` accept (read from its wheel's parsers)."""

    pipeline: bool
    """``--pp-size``."""
    expert: bool
    """``--ep-size``."""
    disaggregation: bool
    """``--disaggregation-mode prefill|decode``."""
    page_size: bool
    """``--page-size`` (else one token per KV slot)."""
    graph_max_flag: str
    """Flag setting the largest decode CUDA-graph batch ("" = none)."""
    fp8_kv: str
    """The fp8 choice of ``--kv-cache-dtype``."""
    init_addr_flag: str
    """Flag naming the rank-0 address of a multi-node server."""
    bench_concurrency: bool
    """``bench_serving --max-concurrency``."""


# sglang==0.3.0 wheel python/sglang/srt/server_args.py ServerArgs.add_cli_args (--kv-cache-dtype auto|fp8_e5m2,
# --nccl-init-addr, no --pp-size/--ep-size/--page-size/--disaggregation-mode) and bench_serving.py (no
# --max-concurrency); sglang==0.5.23 wheel sglang/srt/server_args.py + arg_groups (--pp-size, --ep-size,
# --page-size, --cuda-graph-max-bs-decode, --kv-cache-dtype fp8_e4m3, --dist-init-addr, --disaggregation-mode,
# --disaggregation-transfer-backend mooncake|nixl|...) and sglang/benchmark/serving.py (--max-concurrency).
RELEASES = {
    "0.3.0": SglangRelease(pipeline=False, expert=False, disaggregation=False, page_size=False, graph_max_flag="",
                           fp8_kv="fp8_e5m2", init_addr_flag="--nccl-init-addr", bench_concurrency=False),
    "0.5.23": SglangRelease(pipeline=True, expert=True, disaggregation=True, page_size=True,
                            graph_max_flag="--cuda-graph-max-bs-decode", fp8_kv="fp8_e4m3",
                            init_addr_flag="--dist-init-addr", bench_concurrency=True),
}

PORT = 30000
"""launch_server's default --port: the endpoint the benchmark uses (the router's when there are several servers)."""

BOOTSTRAP_PORT = 8998
"""--disaggregation-bootstrap-port default (0.5.23); each prefill server on a node needs its own."""

TRANSFER_BACKEND = "mooncake"
"""--disaggregation-transfer-backend default (0.5.23), written out."""

_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8": "bfloat16", "fp4": "bfloat16",
          "int4": "float16"}


def export(job: ServeJob) -> tuple[dict[str, str], list[str]]:
    """The files of an SGLang export and what SGLang cannot express."""
    version, rel, notes = pick_release(job.engine, RELEASES)
    _check(job, rel, version)
    target = f"SGLang {version} (python -m sglang.launch_server)"
    approx = notes + _approximations(job, rel)
    launches, comments = _launches(job, rel)
    head = header(job=job, target=target, what="serving launch", approximations=approx)
    files = {"launch.sh": script(header=head, launches=launches, notes=comments)}
    if job.disaggregated:
        files[DYNAMO_FILE], more = deployment(job, "sglang", {p.role: server_args(job, rel, p) for p in job.pools},
                                              head)
        approx += more
    closed = bool(job.work.concurrency)
    bench_notes = [f"endpoint: http://{HOST}:{PORT}"]
    if closed and not rel.bench_concurrency:
        bench_notes.insert(0, f"client: sglang.bench_serving of SGLang >= 0.4 (installed on the client machine): "
                              f"{version}'s has no --max-concurrency (added by sgl-project/sglang#2136, 2024-11)")
    client = sglang_bench(job, port=PORT, max_concurrency=rel.bench_concurrency or closed)
    files["bench.sh"] = bench_file(job, client=client, target=f"sglang.bench_serving against {target}",
                                   notes=bench_notes)
    return files, approx


def _check(job: ServeJob, rel: SglangRelease, version: str) -> None:
    if job.disaggregated and not rel.disaggregation:
        raise ExportError(f"SGLang {version} has no --disaggregation-mode: it cannot run prefill and decode on "
                          "separate servers")
    for pool in job.pools:
        if pool.plan.pp > 1 and not rel.pipeline:
            raise ExportError(f"{pool.role}: pp={pool.plan.pp}: SGLang {version} has no pipeline parallelism "
                              "(no --pp-size); re-plan with pp=1")


def _approximations(job: ServeJob, rel: SglangRelease) -> list[str]:
    e, out, changed = job.engine, [], changed_settings(job.engine)
    if e.multi_step > 1:
        out.append(f"multi_step={e.multi_step}: SGLang schedules and streams every decode step")
    if e.admission == "reserve":
        out.append("admission 'reserve': SGLang admits by an estimate of future KV use and retracts decodes when "
                   "the pool is full; it cannot reserve a request's whole output")
    if e.block_size != 1 and not rel.page_size:
        out.append(f"block_size={e.block_size}: this SGLang pages the KV cache one token per slot (no --page-size)")
    if e.cuda_graph_max_batch and not rel.graph_max_flag and "cuda_graph_max_batch" in changed:
        out.append(f"cuda_graph_max_batch={e.cuda_graph_max_batch}: this SGLang captures decode graphs up to its "
                   "built-in size (no flag); only --disable-cuda-graph is one")
    if e.cuda_graph_max_batch and "cuda_graph_step" in changed:
        out.append(f"cuda_graph_step={e.cuda_graph_step}: SGLang's capture sizes between 4 and the maximum are "
                   "fixed in its code")
    if e.custom_allreduce_bytes and "custom_allreduce_bytes" in changed:
        out.append(f"custom all-reduce up to {e.custom_allreduce_bytes:g} bytes: SGLang's limit is fixed in its "
                   "code (only --disable-custom-all-reduce is a flag)")
    for pool in job.pools:
        p = pool.plan
        if p.ep > 1 and not job.model.is_moe:
            out.append(f"{pool.role}: ep={p.ep} on a dense model: nothing to split by expert, ignored")
        elif p.ep > 1 and not rel.expert:
            out.append(f"{pool.role}: ep={p.ep}: this SGLang has no --ep-size; experts are sharded by tensor "
                       f"parallelism over tp={p.tp}")
        out += [f"{pool.role}: {n}" for n in checkpoint_notes(p.precision)]
        if p.kv_dtype not in ("fp8", p.precision) and not (p.precision in QUANTIZED and p.kv_dtype in ("bf16", "fp16")):
            out.append(f"{pool.role}: KV cache in {p.kv_dtype} with {p.precision} weights: SGLang keeps the KV "
                       "cache in the model dtype unless fp8")
    return out


def server_args(job: ServeJob, rel: SglangRelease, pool: Pool) -> list[str]:
    """The ``launch_server`` options of one replica of ``pool``."""
    e, p = job.engine, pool.plan
    args = ["--tp-size", str(p.moe_group)]  # SGLang's tp-size counts every GPU of the server
    if p.attn_dp > 1:  # attention data-parallel over --dp-size groups of tp-size / dp-size, MoE over all
        args += ["--dp-size", str(p.attn_dp), "--enable-dp-attention"]
    if rel.pipeline:
        args += ["--pp-size", str(p.pp)]
    args += ["--dtype", _DTYPE[p.precision]]
    if p.precision == "fp8":
        args += ["--quantization", "fp8"]
    if p.kv_dtype == "fp8":
        args += ["--kv-cache-dtype", rel.fp8_kv]
    if p.ep > 1 and job.model.is_moe and rel.expert:
        args += ["--ep-size", str(p.ep)]
    chunk = e.max_batched_tokens if e.chunked_prefill else -1
    args += ["--context-length", str(context_len(job)), "--mem-fraction-static", f"{e.kv_memory_fraction:g}",
             "--max-running-requests", str(e.max_num_seqs), "--chunked-prefill-size", str(chunk),
             "--max-prefill-tokens", str(e.max_batched_tokens)]
    if e.mixed_batches and e.chunked_prefill:  # prefill chunks ride in the decode forward (off by default)
        args += ["--enable-mixed-chunk"]
    if rel.page_size:
        args += ["--page-size", str(e.block_size)]
    if e.cuda_graph_max_batch == 0:
        args += ["--disable-cuda-graph"]
    elif rel.graph_max_flag:
        args += [rel.graph_max_flag, str(e.cuda_graph_max_batch)]
    if e.custom_allreduce_bytes == 0:
        args += ["--disable-custom-all-reduce"]
    return args + _speculative_args(p)


SGLANG_DRAFTERS = {"mtp": "NEXTN", "ngram": "NGRAM", "draft": "STANDALONE"}
"""meshplan's drafters as sglang@v0.5.23 srt/arg_groups/fields/spec.py names them (EAGLE heads: EAGLE or
EAGLE3, below)."""


def _speculative_args(p) -> list[str]:
    """``--speculative-*`` of sglang@v0.5.23: a chain of k drafts (``--speculative-eagle-topk 1``, so k + 1 tokens
    verified); an EAGLE head is EAGLE3 when its checkpoint's name says so (the names vLLM reads the same way:
    ``yuhuili/EAGLE3-LLaMA3.1-Instruct-8B``), else EAGLE."""
    spec = p.speculation
    if spec is None:
        return []
    algo = SGLANG_DRAFTERS.get(spec.method) or ("EAGLE3" if "eagle3" in spec.checkpoint.lower() else "EAGLE")
    args = ["--speculative-algorithm", algo, "--speculative-num-steps", str(spec.draft_tokens),
            "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(spec.verify_rows)]
    if spec.checkpoint:
        args += ["--speculative-draft-model-path", spec.checkpoint]
    return args


def _node_args(rel: SglangRelease, nodes: int, rank: int) -> list[str]:
    """A server spanning ``nodes`` nodes: one command per node, rank 0's address given to all."""
    if nodes == 1:
        return []
    return ["--nnodes", str(nodes), "--node-rank", str(rank), rel.init_addr_flag, "HEAD_NODE_IP:20000"]


def _replica(job: ServeJob, rel: SglangRelease, pool: Pool, spot: tuple, *, role: str, extra: list[str],
             port: int) -> list[Launch]:
    """The command(s) of one server: one per node it spans."""
    node, gpus = spot
    nodes = replica_nodes(pool)
    base = ["python", "-m", "sglang.launch_server", "--model-path", job.model_ref, "--host", "0.0.0.0",
            "--port", str(port), *server_args(job, rel, pool), *extra]
    return [Launch(role=role if nodes == 1 else f"{role}, node rank {r}", argv=tuple(base + _node_args(rel, nodes, r)),
                   env=(visible_devices(gpus),), node=node + r) for r in range(nodes)]


def _launches(job: ServeJob, rel: SglangRelease) -> tuple[list[Launch], list[str]]:
    places = placements(job)
    if job.disaggregated:
        return _disaggregated(job, rel, places)
    pool = job.pools[0]
    if pool.replicas > 1 and fits_one_node(job) and pool.plan.attn_dp == 1:
        gpus = sorted({g for _, gs in places["serve"] for g in gs})
        # --dp-size: SGLang's data-parallel controller starts the replicas and spreads requests (round robin)
        return _replica(job, rel, pool, (0, gpus), role=f"{pool.replicas} replicas (--dp-size)",
                        extra=["--dp-size", str(pool.replicas)], port=PORT), []
    ports = [PORT] if pool.replicas == 1 else [PORT + 1 + i for i in range(pool.replicas)]
    launches = []
    for i, (spot, port) in enumerate(zip(places["serve"], ports)):
        launches += _replica(job, rel, pool, spot, role=f"replica {i}", extra=[], port=port)
    notes = _multinode_notes(pool)
    if pool.replicas > 1:
        urls = " ".join(f"http://{HOST}:{p}" for p in ports)
        span = port_span(ports[0], len(ports))
        notes.append(f"{pool.replicas} replicas on ports {span}: route requests to them from port {PORT}, e.g. "
                     f"python -m sglang_router.launch_router --worker-urls {urls} --port {PORT} (package "
                     "sglang-router; not checked here)")
    return launches, notes


def _multinode_notes(pool: Pool) -> list[str]:
    if replica_nodes(pool) == 1:
        return []
    return [f"each {pool.role} server spans {replica_nodes(pool)} nodes: run each node-rank command on its node and "
            "replace HEAD_NODE_IP with the address of the node of rank 0"]


def _disaggregated(job: ServeJob, rel: SglangRelease, places: dict) -> tuple[list[Launch], list[str]]:
    """Prefill and decode servers (docs: SGLang PD disaggregation; sglang 0.5.23
    sglang/test/server_fixtures/disaggregation_fixture.py starts them and the router this way)."""
    launches, urls, per_node = [], {"prefill": [], "decode": []}, {}
    for pool, base_port in zip(job.pools, (PORT + 100, PORT + 200)):
        for i, spot in enumerate(places[pool.role]):
            extra = ["--disaggregation-mode", pool.role, "--disaggregation-transfer-backend", TRANSFER_BACKEND]
            if pool.role == "prefill":
                boot = BOOTSTRAP_PORT + per_node.get(spot[0], 0)
                per_node[spot[0]] = per_node.get(spot[0], 0) + 1
                extra += ["--disaggregation-bootstrap-port", str(boot)]
                urls["prefill"] += ["--prefill", f"http://{HOST}:{base_port + i}", str(boot)]
            else:
                urls["decode"] += ["--decode", f"http://{HOST}:{base_port + i}"]
            launches += _replica(job, rel, pool, spot, role=f"{pool.role} {i}", extra=extra, port=base_port + i)
    router = ["python", "-m", "sglang_router.launch_router", "--pd-disaggregation", *urls["prefill"],
              *urls["decode"], "--host", "0.0.0.0", "--port", str(PORT)]
    launches.append(Launch(role="prefill/decode router (package sglang-router; its flags are not checked here)",
                           argv=tuple(router)))
    notes = [n for pool in job.pools for n in _multinode_notes(pool)]
    notes.append("the router sends each request to a prefill and a decode server; the prefill server hands the KV "
                 f"cache over {TRANSFER_BACKEND} (RDMA; set --disaggregation-ib-device on multi-NIC nodes)")
    return launches, notes
