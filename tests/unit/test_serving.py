"""The serving step and load model: KV bytes by hand (GQA replication, MLA latent), engine sizing rules, CUDA-graph
padding, the memory-bound decode floor, and the request layer's invariants (queued, never out of memory; Little's
law in a closed loop)."""

from __future__ import annotations

import pytest

from meshplan import catalog
from meshplan.cost.memory import layer_params
from meshplan.cost.serve_load import fit_check, kv_capacity_tokens, predict_load
from meshplan.cost.serve_memory import (
    activation_bytes,
    kv_bytes_per_token,
    kv_bytes_per_token_per_gpu,
    weight_bytes_per_gpu,
)
from meshplan.cost.serve_step import decode_time, prefill_time, step_context
from meshplan.errors import SpecError
from meshplan.spec.hardware import GiB
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


def test_fp8_weights_keep_the_embedding_and_head_in_16_bits():
    """fp8 recipes quantize the decoder's linear layers only: Llama-3.1-70B at tp 2 holds half of its 68.45 B layer
    parameters at one byte and half of the 2 x 128,256 x 8192 embedding and head at two."""
    c = ctx_of(tp=2, precision="fp8", kv_dtype="fp8", engine="trtllm")
    m = c.model
    tables = 2 * m.vocab * m.hidden
    layers = sum(sum(layer_params(b.layer)) for b, _ in m.layers())
    assert weight_bytes_per_gpu(m, c.plan) == pytest.approx(layers / 2 * 1.0 + tables / 2 * 2.0)
    assert layers == pytest.approx(68.45e9, rel=0.01)
    # bf16 weights: everything at two bytes.
    b = ctx_of(tp=2, engine="trtllm")
    assert weight_bytes_per_gpu(m, b.plan) == pytest.approx((layers + tables) / 2 * 2.0)


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


def test_decode_streams_the_kv_cache_at_its_own_efficiency():
    """A decode step's attention reads every cached K and V once (kv_tokens x bytes per token / TP shard) at the
    fitted KV-streaming efficiency; without one it falls back to the weights' ``mem_eff``; the GEMMs do not move."""
    from dataclasses import replace

    from meshplan.cost.serve_step import layer_parts

    c = ctx_of(model="llama3.1-70b", tp=4, engine="vllm")
    layer = c.model.blocks[0].layer
    kv_tokens = 64 * 4_000  # 64 sequences of 4,000 cached tokens
    per_rank = kv_tokens * 2 * 8 * 128 * 2 / 4  # K and V, 8 kv heads of 128, bf16, 4 ranks
    bw = c.pool.gpu.hbm_bandwidth
    base = layer_parts(c, layer, tokens=64, seq=4_000, kv_tokens=kv_tokens)
    assert base["attention"] == pytest.approx(per_rank / (bw * c.calib.mem_eff))
    fast = layer_parts(replace(c, kv_eff=0.9), layer, tokens=64, seq=4_000, kv_tokens=kv_tokens)
    assert fast["attention"] == pytest.approx(per_rank / (bw * 0.9))
    assert fast["gemm"] == base["gemm"]
    read = step_context(c.model, c.pool, c.plan, c.engine, {"decode_kv_eff": {c.pool.gpu.generation: 0.8}})
    assert read.kv_eff == 0.8


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
    assert catalog.gpu("mi300x").hbm_bytes == pytest.approx(191.98 * GiB)  # ROCm's HIP reports 192 GiB
    base = gpu_to_dict(catalog.gpu("h100-pcie"))
    assert gpu_from_dict(base).hbm_bytes == pytest.approx(80e9)
    with pytest.raises(SpecError, match="usable_source"):
        gpu_from_dict({**base, "usable_gib": 79})
    with pytest.raises(SpecError, match="usable_gib"):
        gpu_from_dict({**base, "usable_gib": 100, "usable_source": "a measurement"})
    assert gpu_from_dict(gpu_to_dict(catalog.gpu("h100-sxm"))) == catalog.gpu("h100-sxm")  # round trip


@pytest.mark.parametrize("text, name", [
    ("vLLM 0.6.0 (multi-step=10)", "vllm-0.6.0"),          # the SGLang benchmark's own launch flags
    ("NVIDIA NIM 1.12.0", "nim-1.8"),                      # NIM's harness by prefix
    ("vLLM 0.8.5", "vllm"),                                # V1, the default since 0.8.0
    ("vLLM 0.8", "vllm"),                                  # "0.8" is the 0.8.0 release
    ("TGI 3.0", "tgi"),
    ("vLLM 0.6.0", "vllm-0.6"),                            # V0 release defaults, not the benchmark's flags
    ("vLLM 0.5.3", "vllm-0.6"),                            # older than every profile: the oldest
    ("vLLM 0.6.6.post1", "vllm-0.7"),                      # V0 with the 2048-token chunked budget
    ("vLLM 0.7.3", "vllm-0.7"),
    ("SGLang v0.4.6.post1", "sglang"),
    ("TensorRT-LLM 0.19 (trtllm-serve)", "trtllm-0.17"),   # 0.x: the TRT engine flow
    ("trtllm-serve 1.0", "trtllm"),                        # 1.x: the PyTorch backend
    ("TensorRT-LLM 1.1.0rc2", "trtllm"),
    ("vllm", "vllm"),                                      # no version: the newest release
])
def test_engine_for_reads_family_and_version(text, name):
    prof, note = catalog.engine_for(text)
    assert prof.name == name and prof.name in note
    assert not (prof.harness and not any(text.lower().startswith(m.lower()) for m in prof.matches))


def test_engine_for_unknown_family_names_the_families():
    with pytest.raises(SpecError, match="vllm, sglang, trtllm, tgi, lmdeploy"):
        catalog.engine_for("llama.cpp b4000")


def test_trtllm_bench_sizes_its_engine_from_the_dataset():
    """trtllm-bench's build heuristics (tuning.py): requests the KV cache holds at ISL + OSL, 95 % of the memory
    the fp8 weights leave, rounded up as the tool does. Llama-3.1-8B fp8 on one H100 (79.1 GiB): 0.95 x (84.93e9
    - 8.03e9) / (65,536 B x 2,176) = 512 requests at 2048/128 -> batch 640 (128-multiples), tokens 512 x 17 ->
    9,216; at 128/128 the 4,096-request cap binds and tokens are 4,096 x 2 = 8,192."""
    from meshplan.cost.serve_sizing import SIZINGS, sized_engine
    from meshplan.spec.engine import BUILD_SIZINGS

    assert set(SIZINGS) == set(BUILD_SIZINGS)
    e = catalog.engine("trtllm-0.17")
    model, pool = catalog.model("llama3.1-8b"), catalog.cluster("1xh100-sxm").pools[0]
    plan = ServePlan(precision="fp8", kv_dtype="fp8", engine=e.name)
    long = sized_engine(e, model, plan, pool, Workload(input_len=2048, output_len=128))
    assert (long.max_num_seqs, long.max_batched_tokens) == (640, 9216)
    short = sized_engine(e, model, plan, pool, Workload(input_len=128, output_len=128))
    assert (short.max_num_seqs, short.max_batched_tokens) == (4096, 8192)
    # A profile without the rule is left as profiled.
    assert sized_engine(catalog.engine("vllm"), model, plan, pool, Workload(input_len=128, output_len=128)) \
        == catalog.engine("vllm")


def test_vllm_v0_sizes_its_scheduler_from_the_model_context():
    """vLLM V0 (arg_utils.py create_engine_config, config.py SchedulerConfig): chunked prefill is on by default only
    past 32K context, in the profile's budget (512 tokens in 0.6, 2048 in 0.7) shared with the decodes; else a step
    runs prompts or decodes, max(max_model_len, 2048) tokens, and the profile run is one such step."""
    from meshplan.cost.serve_sizing import sized_engine

    pool, plan, work = catalog.cluster("1xh100-sxm").pools[0], ServePlan(), Workload(input_len=128, output_len=128)
    for name, budget in (("vllm-0.6", 512), ("vllm-0.7", 2048)):
        e = catalog.engine(name)
        long = sized_engine(e, catalog.model("llama3.1-8b"), plan, pool, work)  # 131,072 positions
        assert (long.chunked_prefill, long.mixed_batches, long.max_batched_tokens, long.activation_tokens) == \
            (True, True, budget, budget)
        short = sized_engine(e, catalog.model("llama2-7b"), plan, pool, work)  # 4,096 positions
        assert (short.chunked_prefill, short.mixed_batches, short.max_batched_tokens, short.activation_tokens) == \
            (False, False, 4096, 4096)
        assert (e.max_num_seqs, e.cuda_graph_max_batch, e.multi_step) == (256, 256, 1)


def test_a_release_profile_shares_the_host_times_of_its_harness():
    """vllm-0.6 is the V0 code the vllm-0.6.0 harness ran with other flags: it takes that profile's fitted host
    time per step (``host_of``), where a profile without one would fall back to its family's."""
    consts = {"step_host_s": {"vllm-0.6.0": 0.002}, "seq_host_s": {"vllm": 1e-5}}
    model, pool = catalog.model("llama3.1-8b"), catalog.cluster("1xh100-sxm").pools[0]
    v0 = step_context(model, pool, ServePlan(), catalog.engine("vllm-0.6"), consts)
    v1 = step_context(model, pool, ServePlan(), catalog.engine("vllm"), consts)
    assert (v0.step_host_s, v0.seq_host_s) == (0.002, 1e-5)
    assert (v1.step_host_s, v1.seq_host_s) == (0.0, 1e-5)


def test_an_overlap_scheduler_hides_host_work_under_the_step():
    """SGLang's overlap scheduler (and TensorRT-LLM's PyTorch executor) prepares the next step while the GPUs run
    this one: a step takes max(device, host) where a serial loop takes device + host; the breakdown still sums."""
    from dataclasses import replace

    from meshplan.cost.serve_step import decode_breakdown

    consts = {"step_host_s": {"sglang": 0.001}, "seq_host_s": {"sglang": 6e-5}}
    model, pool = catalog.model("llama3.1-8b"), catalog.cluster("1xh100-sxm").pools[0]
    overlap = catalog.engine("sglang")
    assert overlap.overlap_host and not catalog.engine("sglang-0.3.0").overlap_host
    serial = replace(overlap, overlap_host=False)
    for batch in (16, 1024):  # host 2 ms under a longer step; 62 ms over a shorter one
        host = 0.001 + batch * 6e-5
        a = step_context(model, pool, ServePlan(), overlap, consts)
        b = step_context(model, pool, ServePlan(), serial, consts)
        device = decode_time(b, batch=batch, context=1000) - host
        assert decode_time(a, batch=batch, context=1000) == pytest.approx(max(device, host), rel=1e-12)
        assert sum(decode_breakdown(a, batch=batch, context=1000).values()) == \
            pytest.approx(decode_time(a, batch=batch, context=1000), rel=1e-12)
    # SGLang turns the overlap off with pipeline parallelism (server_args.py _handle_pipeline_parallelism)
    assert overlap.overlaps_host(1) and not overlap.overlaps_host(2)
    assert catalog.engine("trtllm").overlaps_host(4)


def test_a_generation_without_serving_rows_takes_the_fitted_generations_median():
    """No visible serving row runs on Blackwell: a serving engine there takes the median of the fitted generations'
    kernel constants, not the training fit's; the runtime's own decoder (a training stack's kernels) keeps its
    calibration."""
    from meshplan.cost.calib import gpu_calibration

    consts = {"decode_mem_eff": {"ampere": 0.6, "hopper": 0.65, "ada": 0.95}, "allreduce_s": {"hopper": 8e-6}}
    model = catalog.model("llama3.1-8b")
    b200 = catalog.cluster("1xb200").pools[0]
    ctx = step_context(model, b200, ServePlan(), catalog.engine("vllm"), consts)
    assert (ctx.calib.mem_eff, ctx.allreduce_s) == (0.65, 8e-6)
    assert step_context(model, catalog.cluster("1xh100-sxm").pools[0], ServePlan(), catalog.engine("vllm"),
                        consts).calib.mem_eff == 0.65
    own = step_context(model, b200, ServePlan(), catalog.engine("meshplan"), consts)
    assert own.calib.mem_eff == gpu_calibration(b200.gpu).mem_eff and own.allreduce_s == 0.0


def test_host_time_per_sequence_adds_to_every_step():
    """``seq_host_s`` is host work per running sequence per step: a decode step of 100 sequences gains exactly
    100 of it, a prefill step of 4 prompts 4, and an engine without it is unchanged."""
    p = ServePlan(engine="vllm")
    pool = catalog.cluster("1xh100-sxm").pools[0]
    model, eng = catalog.model("llama3.1-8b"), catalog.engine("vllm")
    bare = step_context(model, pool, p, eng, {})
    busy = step_context(model, pool, p, eng, {"seq_host_s": {"vllm": 2e-5}})
    assert decode_time(busy, batch=100, context=500) - decode_time(bare, batch=100, context=500) == pytest.approx(2e-3)
    gap = prefill_time(busy, tokens=300, prompts=4) - prefill_time(bare, tokens=300, prompts=4)
    assert gap == pytest.approx(4 * 2e-5)
    other = step_context(model, pool, p, eng, {"seq_host_s": {"vllm": 0.0, "sglang": 2e-5}})
    assert decode_time(other, batch=100, context=500) == decode_time(bare, batch=100, context=500)


def test_an_engine_family_no_fitted_row_ran_takes_the_fitted_engines_median_host_times():
    """TGI has no visible serving row: its host time per step and per sequence are the medians of the engines
    fitted, where a fitted family keeps its own (and a profile with none of its own, its family's: 0 here); the
    runtime's own decoder is timed by its training stack and takes none."""
    consts = {"step_host_s": {"nim-1.8": 0.001, "trtllm-0.17": 0.002, "vllm-0.6.0": 0.002, "sglang-0.3.0": 0.0},
              "seq_host_s": {"sglang": 6e-5, "trtllm": 1e-5, "vllm": 5e-6}}
    model, pool = catalog.model("llama3.1-8b"), catalog.cluster("1xh100-sxm").pools[0]
    tgi = step_context(model, pool, ServePlan(engine="tgi"), catalog.engine("tgi"), consts)
    assert (tgi.step_host_s, tgi.seq_host_s) == (0.0015, 1e-5)
    v1 = step_context(model, pool, ServePlan(), catalog.engine("vllm"), consts)
    assert (v1.step_host_s, v1.seq_host_s) == (0.0, 5e-6)
    own = step_context(model, pool, ServePlan(engine="meshplan"), catalog.engine("meshplan"), consts)
    assert (own.step_host_s, own.seq_host_s) == (0.0, 0.0)


def test_every_tp_all_reduce_pays_the_barrier_constant():
    """``allreduce_s`` is added to each TP all-reduce: a decode step of a 32-layer model at tp 2 gains 2 x 32 of
    it (one after attention, one after the MLP), a single GPU nothing."""
    model, eng = catalog.model("llama3.1-8b"), catalog.engine("vllm")
    for tp, calls in ((1, 0), (2, 2 * model.n_layers)):
        p = ServePlan(tp=tp, engine="vllm")
        pool = catalog.cluster(f"{tp}xh100-sxm").pools[0]
        bare = step_context(model, pool, p, eng, {})
        slow = step_context(model, pool, p, eng, {"allreduce_s": {"hopper": 1e-5}})
        gap = decode_time(slow, batch=8, context=500) - decode_time(bare, batch=8, context=500)
        assert gap == pytest.approx(calls * 1e-5, abs=1e-9)


def test_fp4_serving_reads_nvfp4_weights_on_fp4_tensor_cores():
    """NVFP4 (ModelOpt's W4A4): 4-bit E2M1 values plus one E4M3 scale per 16 = 4.5 bits a weight; its GEMMs run at
    the FP4 peak (B200: 9 PFLOP/s dense, its datasheet's sparse / 2) with the fixed part of a tile weighing 4x;
    a GPU without FP4 tensor cores refuses the plan, naming the ones that have them."""
    from meshplan.cost.compute import gemm_time, shape_eff
    from meshplan.cost.ops import Gemm
    from meshplan.spec.calibration import Calibration

    assert ServePlan(precision="fp4").weight_bytes == 0.5625
    b200, h100 = catalog.gpu("b200"), catalog.gpu("h100-sxm")
    assert (b200.peak_flops("fp4"), h100.peak_flops("fp4")) == (9000e12, 0.0)
    calib = Calibration(fp8_eff=0.7, n_half=64, launch_s=0.0, mem_eff=0.8)
    g = Gemm(name="fc1", m=8192, n=8192, k=8192, linear=True)
    compute = g.flops / (9000e12 * 0.7 * shape_eff(8192, 8192, 8192, calib, rate=4.0))
    memory = 0.5625 * 3 * 8192 * 8192 / (b200.hbm_bandwidth * 0.8)
    assert gemm_time(g, gpu=b200, calib=calib, dtype="fp4") == pytest.approx(max(compute, memory))
    assert shape_eff(256, 8192, 8192, calib, rate=4.0) == pytest.approx(shape_eff(256, 8192, 8192,
                                                                               Calibration(n_half=256), rate=1.0))
    with pytest.raises(SpecError, match="FP4 tensor cores.*b200"):
        step_context(catalog.model("llama3.1-8b"), catalog.cluster("1xh100-sxm").pools[0], ServePlan(precision="fp4"),
                     catalog.engine("vllm"), {})
    from meshplan.calibrate.serve_validate import row_plan

    plan = row_plan({"precision": "NVFP4", "tp": "1", "pp": "1", "dp": "1"}, catalog.engine("trtllm-0.17"))
    assert (plan.precision, plan.kv_dtype) == ("fp4", "fp8")  # ModelOpt NVFP4 exports set kv_cache_quant_algo FP8
    mx = row_plan({"precision": "MXFP4", "tp": "1", "pp": "1", "dp": "1"}, catalog.engine("vllm"))
    assert mx.precision == "fp4"  # OCP MXFP4 (AMD's MLPerf, gpt-oss) runs on the same FP4 tensor cores


def test_int4_weight_only_reads_packed_weights_and_computes_in_16_bits():
    """AWQ / GPTQ weight-only int4 (group 128: eight weights per int32, one fp16 scale and one 4-bit zero per
    group, 4 + 20/128 bits a weight): a linear GEMM computes at the 16-bit peak while it reads its weights at that
    width and its activations at 16 bits; attention and the other GEMMs are plain 16-bit."""
    from meshplan.cost.compute import gemm_time, shape_eff
    from meshplan.cost.ops import Gemm
    from meshplan.spec.calibration import Calibration

    assert ServePlan(precision="int4").weight_bytes == pytest.approx((4 + 20 / 128) / 8)
    a100 = catalog.gpu("a100-80gb")
    calib = Calibration(gemm_eff=0.7, n_half=64, launch_s=0.0, mem_eff=0.8)
    for m in (8, 4096):  # a decode batch (weight reads bound it) and a prefill chunk (compute bounds it)
        g = Gemm(name="fc1", m=m, n=8192, k=8192, linear=True)
        compute = g.flops / (a100.peak_flops("bf16") * 0.7 * shape_eff(m, 8192, 8192, calib))
        memory = ((4 + 20 / 128) / 8 * 8192 * 8192 + 2 * (m * 8192 + m * 8192)) / (a100.hbm_bandwidth * 0.8)
        assert gemm_time(g, gpu=a100, calib=calib, dtype="int4") == pytest.approx(max(compute, memory))
    bmm = Gemm(name="scores", m=512, n=512, k=128, linear=False)
    assert gemm_time(bmm, gpu=a100, calib=calib, dtype="int4") == gemm_time(bmm, gpu=a100, calib=calib, dtype="bf16")
    from meshplan.calibrate.serve_validate import row_plan

    plan = row_plan({"precision": "AWQ", "tp": "2", "pp": "1", "dp": "1"}, catalog.engine("vllm"))
    assert (plan.precision, plan.kv_dtype) == ("int4", "bf16")


def test_every_inference_metric_is_predicted_by_its_definition():
    """INFERENCE.md's eight metrics: per-GPU throughput is the output tokens over every GPU the deployment uses
    (trtllm-bench's "Per GPU Output Throughput"), total throughput adds the prompt tokens taken in."""
    from meshplan.calibrate.serve_validate import METRICS

    model, pool = catalog.model("llama3.1-8b"), catalog.cluster("2xh100-sxm").pools[0]
    ctx = step_context(model, pool, ServePlan(), catalog.engine("vllm"), {})
    work = Workload(input_len=1000, output_len=200)
    pred = predict_load(ctx, work, replicas=2)
    assert pred.metric("tokens_per_s_per_gpu") == pytest.approx(pred.output_tokens_per_s / 2)
    assert pred.metric("total_tokens_per_s") == pytest.approx(pred.requests_per_s * 1200)
    assert pred.metric("output_tokens_per_s") == pytest.approx(pred.requests_per_s * 200)
    assert all(pred.metric(m) > 0 for m in METRICS)


def test_mi325x_is_the_mi300x_compute_with_more_and_faster_hbm():
    """AMD's datasheets: the same CDNA 3 peaks, 256 GiB at 6.0 TB/s against 192 GiB at 5.3 (HIP reports 255.98 and
    191.98 GiB); a 70B decode step on it is shorter by at most the bandwidth ratio, and its KV cache is larger."""
    from meshplan.calibrate.serve_constants import load_constants
    from meshplan.cost.serve_load import kv_capacity_tokens, predict_load
    from meshplan.cost.serve_step import step_context
    from meshplan.spec.serving import ServePlan, Workload

    a, b = catalog.gpu("mi300x"), catalog.gpu("mi325x")
    assert a.peak == b.peak and a.generation == b.generation == "cdna3"
    assert b.hbm_bytes == pytest.approx(255.98 * 2**30)
    assert b.hbm_bandwidth / a.hbm_bandwidth == pytest.approx(6.0 / 5.3)
    model, work, consts = catalog.model("llama3.1-70b"), Workload(input_len=1000, output_len=1000, concurrency=8), \
        load_constants()
    ctx = {g: step_context(model, catalog.cluster(f"1x{g}").pools[0], ServePlan(), catalog.engine("vllm"), consts)
           for g in ("mi300x", "mi325x")}
    assert kv_capacity_tokens(ctx["mi325x"]) > kv_capacity_tokens(ctx["mi300x"])
    tpot = {g: predict_load(c, work).tpot for g, c in ctx.items()}
    assert 5.3 / 6.0 * 0.99 < tpot["mi325x"] / tpot["mi300x"] < 1.0


def test_a_fused_moe_kernel_launches_once_for_every_expert():
    """A decode step of 64 DeepSeek-V3 tokens touches 222 of 256 experts per layer (256 (1 - (1 - 8/256)^64)).
    The engines run them in one fused kernel per GEMM (vLLM / SGLang fused_moe, TRT-LLM's MoE plugin), so the
    step is bounded by reading their weights, not by 222 launch floors; the runtime's eager loop keeps one launch
    per expert."""
    from dataclasses import replace as _replace

    from meshplan.calibrate.serve_constants import load_constants
    from meshplan.cost.compute import gemm_time
    from meshplan.cost.ops import Gemm
    from meshplan.cost.serve_step import layer_parts

    consts = load_constants()
    pool = catalog.cluster("8xh200").pools[0]
    model = catalog.model("deepseek-v3")
    plan = ServePlan(tp=8, precision="fp8", kv_dtype="bf16", engine="sglang")
    fused = step_context(model, pool, plan, catalog.engine("sglang"), consts)
    eager = step_context(model, pool, plan, _replace(catalog.engine("sglang"), kernel_stack="meshplan"), consts)
    layer = next(b.layer for b in model.blocks if b.layer.moe is not None)
    a = layer_parts(fused, layer, tokens=64, seq=1500, kv_tokens=64 * 1500)["gemm"]
    b = layer_parts(eager, layer, tokens=64, seq=1500, kv_tokens=64 * 1500)["gemm"]
    launch = fused.calib.launch_s
    assert b >= 2 * 200 * launch and a < b / 3  # two expert GEMMs of ~222 launch floors each, gone under fusion
    g = Gemm(name="expert_fc1", m=2, n=256, k=7168, count=222, grouped=True)
    assert gemm_time(_replace(g, launches=1), gpu=pool.gpu, calib=fused.calib, dtype="fp8") < 222 * launch
    assert gemm_time(g, gpu=pool.gpu, calib=fused.calib, dtype="fp8") >= 222 * launch


def test_mi355x_peaks_follow_cdna4_s_matrix_rates():
    """256 CUs x 8,192 FP8 FLOPs per CU per clock x 2.4 GHz = 5,033 dense TFLOPS; BF16 half, MXFP4 twice; it
    serves NVFP4-class 4-bit weights where the MI300X refuses them, and a generation no row runs takes the fitted
    generations' median constants."""
    g = catalog.gpu("mi355x")
    assert g.peak_flops("fp8") == pytest.approx(256 * 8192 * 2.4e9, rel=1e-4)
    assert g.peak_flops("fp4") == pytest.approx(2 * g.peak_flops("fp8"), rel=1e-4)
    assert g.peak_flops("bf16") == pytest.approx(g.peak_flops("fp8") / 2, rel=1e-4)
    from meshplan.calibrate.serve_constants import load_constants
    from meshplan.cost.serve_step import per_generation

    consts = load_constants()
    ctx = step_context(catalog.model("llama3.1-70b"), catalog.cluster("1xmi355x").pools[0],
                       ServePlan(precision="fp4", engine="vllm"), catalog.engine("vllm"), consts)
    assert decode_time(ctx, batch=1, context=1000) > 0
    assert per_generation(consts, "decode_mem_eff", "cdna4", catalog.engine("vllm")) is not None
    with pytest.raises(SpecError, match="fp4"):
        step_context(catalog.model("llama3.1-70b"), catalog.cluster("1xmi300x").pools[0],
                     ServePlan(precision="fp4", engine="vllm"), catalog.engine("vllm"), consts)
