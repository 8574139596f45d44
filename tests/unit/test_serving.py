"""The serving step and load model: KV bytes by hand (GQA replication, MLA latent), engine sizing rules, CUDA-graph
padding, the memory-bound decode floor, and the request layer's invariants (queued, never out of memory; Little's
law in a closed loop)."""

from __future__ import annotations

import pytest

from meshplan import catalog
from meshplan.cost.serve_load import fit_check, kv_capacity_tokens, predict_load
from meshplan.cost.serve_step import (
    GiB,
    activation_bytes,
    decode_time,
    kv_bytes_per_token,
    kv_bytes_per_token_per_gpu,
    step_context,
    weight_bytes_per_gpu,
)
from meshplan.errors import SpecError
from meshplan.spec.serving import ServePlan, Workload


def ctx_of(model="llama3.1-70b", gpu="h100-sxm", engine="vllm", **plan):
    p = ServePlan(engine=engine, **plan)
    cluster = catalog.cluster(f"{p.gpus_per_replica}x{gpu}")
    return step_context(catalog.model(model), cluster.pools[0], p, catalog.engine(engine), {})


def test_kv_bytes_per_token_by_hand():
    llama = catalog.model("llama3.1-70b")
    # 80 layers x K and V x 8 kv heads x 128 x 2 bytes = 327,680 B (320 KiB) per token in bf16.
    assert sum(kv_bytes_per_token(b.layer, 2.0) for b, _ in llama.layers()) == 327_680
    assert kv_bytes_per_token_per_gpu(llama, ServePlan(tp=8)) == 327_680 / 8
    # Beyond tp = n_kv the heads replicate: tp 16 holds what tp 8 holds; fp8 halves it; pp 2 halves the layers.
    assert kv_bytes_per_token_per_gpu(llama, ServePlan(tp=16)) == 327_680 / 8
    assert kv_bytes_per_token_per_gpu(llama, ServePlan(tp=8, kv_dtype="fp8")) == 327_680 / 16
    assert kv_bytes_per_token_per_gpu(llama, ServePlan(tp=8, pp=2)) == 327_680 / 16
    # MLA: one latent of 512 + 64 per layer, replicated on every TP rank: 61 x 576 x 2 = 70,272 B.
    ds = catalog.model("deepseek-v3")
    per_layer = {kv_bytes_per_token(b.layer, 2.0) for b, _ in ds.layers()}
    assert per_layer == {576 * 2}
    assert kv_bytes_per_token_per_gpu(ds, ServePlan(tp=8)) == ds.n_layers * 576 * 2


def test_vllm_sizes_its_cache_from_total_memory():
    c = ctx_of(model="llama3.1-8b", engine="vllm")
    w = weight_bytes_per_gpu(c.model, c.plan)
    assert w == pytest.approx(8.03e9 * 2, rel=0.01)  # Llama-3.1-8B: 8.03 B parameters in bf16
    free = 0.9 * 79.1 * GiB - w - activation_bytes(c.model, c.plan, c.engine) - c.engine.runtime_reserve_gib * GiB
    # 79.1 GiB: what CUDA reports on an H100 80GB; 32 x 2 x 8 x 128 x 2 B per token, in whole 16-token blocks
    assert kv_capacity_tokens(c) == pytest.approx(free / 131_072, abs=16)


def test_cuda_graph_padding_is_piecewise():
    e = catalog.engine("vllm-0.6.0")
    assert [e.graph_batch(b) for b in (1, 3, 5, 9, 256, 300)] == [1, 4, 8, 16, 256, 300]
    assert e.uses_graph(256) and not e.uses_graph(257)


def test_decode_is_memory_bound_at_batch_one():
    """Batch 1: the step reads every weight but the input embedding (one row of it) once, so it takes at least
    those bytes over the HBM bandwidth at the roofline's efficiency, and little more."""
    c = ctx_of(model="llama3.1-8b", engine="vllm")
    embedding = c.model.vocab * c.model.hidden * 2.0
    floor = (weight_bytes_per_gpu(c.model, c.plan) - embedding) / c.pool.gpu.hbm_bandwidth
    t = decode_time(c, batch=1, context=1000)
    assert floor / c.calib.mem_eff <= t <= 1.3 * floor / c.calib.mem_eff
    # More sequences read more KV: the step grows, but far less than linearly while weights dominate.
    t64 = decode_time(c, batch=64, context=1000)
    assert t < t64 < 4 * t


def test_concurrency_beyond_the_cache_is_queued_not_oom():
    c = ctx_of(model="llama3.1-70b", tp=4, engine="vllm")
    work = Workload(input_len=20_000, output_len=2_000, concurrency=50)
    assert fit_check(c, work) is None
    p = predict_load(c, work)
    assert p.limited_by == "kv cache" and p.resident < 50 and p.queue_dominated
    # Closed loop, Little's law: the clients are either waiting or being served.
    assert p.requests_per_s * p.e2e == pytest.approx(50, rel=0.02)
    few = predict_load(c, Workload(input_len=20_000, output_len=2_000, concurrency=2))
    assert few.ttft < p.ttft and few.queue_wait < 0.5 * few.ttft


def test_weights_that_leave_no_room_are_the_only_oom():
    c = ctx_of(model="llama3.1-405b", tp=2, engine="vllm")
    bad = fit_check(c, Workload(input_len=128, output_len=128))
    assert bad is not None and bad.kind == "memory"
    # 405.9e9 parameters x 2 bytes / 2 GPUs = 378.0 GiB of weights per GPU
    assert "378.0 GiB of bf16 weights per GPU leave no KV cache" in bad.reason, bad.reason


def test_offline_throughput_rises_with_tp_replicas_and_fp8():
    work = Workload(input_len=128, output_len=128)
    one = predict_load(ctx_of(model="llama3.1-8b", engine="trtllm-0.17"), work)
    two = predict_load(ctx_of(model="llama3.1-8b", engine="trtllm-0.17"), work, replicas=2)
    fp8 = predict_load(ctx_of(model="llama3.1-8b", engine="trtllm-0.17", precision="fp8", kv_dtype="fp8"), work)
    assert two.output_tokens_per_s == pytest.approx(2 * one.output_tokens_per_s)
    assert fp8.output_tokens_per_s > one.output_tokens_per_s


def test_bad_serving_input_is_one_clear_error():
    with pytest.raises(SpecError, match="workload.input_len"):
        Workload(input_len=0, output_len=10)
    with pytest.raises(SpecError, match="not both"):
        Workload(input_len=1, output_len=1, concurrency=2, rate=1.0)
    with pytest.raises(SpecError, match="serve.kv_dtype"):
        ServePlan(kv_dtype="int3")
    with pytest.raises(SpecError, match="did you mean"):
        catalog.engine("vlm")


@pytest.mark.parametrize("name", catalog.engine_names())
def test_every_engine_profile_loads_and_cites_its_settings(name):
    e = catalog.engine(name)
    assert e.name == name and e.sources


def test_device_memory_is_what_cuda_reports_where_measured():
    """NVIDIA's "80 GB" is 80 GiB of HBM, of which CUDA shows 79.1 GiB on an H100: the catalog carries the
    measured total with its source, and a GPU file without one falls back to the datasheet's decimal GB."""
    from meshplan.spec.io import gpu_from_dict, gpu_to_dict

    assert catalog.gpu("h100-sxm").hbm_bytes == pytest.approx(79.1 * GiB)
    assert catalog.gpu("h200").hbm_bytes == pytest.approx(139.8 * GiB)
    base = gpu_to_dict(catalog.gpu("mi300x"))
    assert gpu_from_dict(base).hbm_bytes == pytest.approx(192e9)
    with pytest.raises(SpecError, match="usable_source"):
        gpu_from_dict({**base, "usable_gib": 190})
    with pytest.raises(SpecError, match="usable_gib"):
        gpu_from_dict({**base, "usable_gib": 300, "usable_source": "a measurement"})
    assert gpu_from_dict(gpu_to_dict(catalog.gpu("h100-sxm"))) == catalog.gpu("h100-sxm")  # round trip


@pytest.mark.parametrize("text, name", [
    ("vLLM 0.6.0 (multi-step=10)", "vllm-0.6.0"),          # the SGLang benchmark's own launch flags
    ("NVIDIA NIM 1.12.0", "nim-1.8"),                      # NIM's harness by prefix
    ("vLLM 0.8.5", "vllm"),                                # a release with no profile: the family's nearest
    ("SGLang v0.4.6.post1", "sglang"),
    ("TensorRT-LLM 0.19 (trtllm-serve)", "trtllm-0.17"),   # same major version: the TRT engine flow
    ("trtllm-serve 1.0", "trtllm"),                        # 1.x: the PyTorch backend
    ("vllm", "vllm"),                                      # no version: the newest release
])
def test_engine_for_reads_family_and_version(text, name):
    prof, note = catalog.engine_for(text)
    assert prof.name == name and prof.name in note
    assert not (prof.harness and not any(text.startswith(m) for m in prof.matches))


def test_engine_for_unknown_family_names_the_families():
    with pytest.raises(SpecError, match="vllm, sglang, trtllm"):
        catalog.engine_for("LMDeploy 0.7")
