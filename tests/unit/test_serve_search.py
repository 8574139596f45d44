"""The serving search: candidates respect the cluster and the pins, the winner is the best that meets the SLOs,
disaggregation prices the KV transfer and frees decode from prefills, percentiles follow their closed forms, and
the CLI answers bad input in one line and an unmeetable SLO with the nearest option."""

from __future__ import annotations

import math
import subprocess
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan import catalog
from meshplan.calibrate.serve_constants import load_constants
from meshplan.cost.comm import collective_time
from meshplan.cost.serve_disagg import kv_transfer_time, predict_disagg
from meshplan.cost.serve_kernels import engine_small_kernels, experts_touched
from meshplan.cost.serve_load import ServePrediction, predict_load
from meshplan.cost.serve_step import (
    allreduce_time,
    decode_breakdown,
    decode_time,
    step_context,
)
from meshplan.cost.serve_tail import quantile, wait_quantile
from meshplan.search.serve import search
from meshplan.search.serve_explain import explain
from meshplan.search.serve_request import ServeRequest, Slo
from meshplan.spec.cluster import group_link
from meshplan.spec.serving import ServePlan, Workload

CONSTS = load_constants()
LLAMA70 = catalog.model("llama3.1-70b")
H100X8 = catalog.cluster("8xh100-sxm")
WORK = Workload(input_len=1000, output_len=1000, concurrency=64)


def _request(**kw) -> ServeRequest:
    base = dict(model=LLAMA70, cluster=H100X8, engine=catalog.engine("vllm"), work=WORK,
                slo=Slo(ttft=1.0, tpot=0.04), constants=CONSTS)
    return ServeRequest(**{**base, **kw})


def _ctx(plan: ServePlan, model=LLAMA70, engine="vllm"):
    return step_context(model, H100X8.pools[0], plan, catalog.engine(engine), CONSTS)


def test_winner_is_the_best_deployment_that_meets_the_slos():
    res = search(_request())
    best = res.best
    assert best is not None and best.meets
    meeting = res.meeting
    assert best.pred.tokens_per_s_per_gpu == max(c.pred.tokens_per_s_per_gpu for c in meeting)
    assert all(c.gpus <= 8 for c in res.candidates)
    assert all(c.tails["ttft"] <= 1.0 and c.tails["tpot"] <= 0.04 for c in meeting)
    # one 80 GiB H100 (79.1 GiB visible) cannot hold 70B in bf16 (131 GiB): refused with the weights named, never
    # ranked; two can (65.7 GiB each leave about 10 GiB of KV cache)
    assert "1xtp1" in {lbl for lbl, _ in res.infeasible}
    assert "1xtp2" not in {lbl for lbl, _ in res.infeasible}
    assert all(c.plan.tp * c.plan.pp >= 2 for c in res.candidates if not c.disaggregated)


def test_latency_objective_and_pins():
    res = search(_request(objective="latency"))
    assert res.best.tails["e2e"] == min(c.tails["e2e"] for c in res.meeting)
    pinned = search(_request(tp=8, replicas=1, disagg="off"))
    assert pinned.candidates and all(c.plan.tp == 8 and c.plan.replicas == 1 for c in pinned.candidates)


def test_pareto_front_is_not_dominated():
    res = search(_request())
    front = res.pareto()
    for f in front:
        assert not any(c.pred.tokens_per_s_per_gpu > f.pred.tokens_per_s_per_gpu and c.tails["tpot"] < f.tails["tpot"]
                       for c in res.meeting)
    assert front[0].pred.tokens_per_s_per_gpu == res.best.pred.tokens_per_s_per_gpu


def test_kv_transfer_is_the_prompt_kv_over_parallel_lanes():
    pre, dec = _ctx(ServePlan(tp=4)), _ctx(ServePlan(tp=4))
    # Llama-3.1-70B: 80 layers x 2 (K, V) x 8 kv heads x 128 dims x 2 bytes per token
    nbytes = 1000 * 80 * 2 * 8 * 128 * 2
    link = group_link(H100X8.pools[0], size=2, stride=4)
    assert link.level == "nvlink"  # two tp4 replicas share the 8-GPU node
    want = collective_time("send_recv", nbytes / 4, size=2, link=link, calib=pre.calib)
    assert kv_transfer_time(pre, dec, tokens=1000) == pytest.approx(want)


def test_disaggregated_decode_carries_no_prefill():
    pre, dec = _ctx(ServePlan(tp=4)), _ctx(ServePlan(tp=4))
    p = predict_disagg(pre, dec, WORK, n_prefill=1, n_decode=1)
    assert p.tpot == pytest.approx(decode_time(dec, batch=64, context=1500))
    assert p.ttft >= p.prefill + p.kv_transfer + p.decode_step
    agg = predict_load(_ctx(ServePlan(tp=4)), WORK, replicas=1)
    assert agg.tpot > agg.decode_step  # aggregated: prefills share the decode steps


def test_one_shot_all_reduce_needs_nvlink():
    # TensorRT-LLM's AUTO strategy and vLLM's custom all-reduce fall back to NCCL without NVLink (allreducePlugin.cpp
    # selectImplementation; custom_all_reduce.py): on 8 PCIe L40S a KB-sized decode all-reduce is NCCL's ring
    l40s = catalog.cluster("8xl40s").pools[0]
    ctx = step_context(LLAMA70, l40s, ServePlan(tp=8), catalog.engine("trtllm-0.17"), CONSTS)
    link = group_link(l40s, size=8, stride=1)
    nbytes = 64 * 8192 * 2.0
    ring = collective_time("all_reduce", nbytes, size=8, link=link, calib=ctx.calib) + ctx.allreduce_s
    assert allreduce_time(ctx, nbytes) == pytest.approx(ring)
    nv = step_context(LLAMA70, H100X8.pools[0], ServePlan(tp=8), catalog.engine("trtllm-0.17"), CONSTS)
    h100 = group_link(H100X8.pools[0], size=8, stride=1)
    assert allreduce_time(nv, nbytes) < collective_time("all_reduce", nbytes, size=8, link=h100, calib=nv.calib)


def test_decode_breakdown_sums_to_the_step():
    for plan, batch in ((ServePlan(tp=8), 64), (ServePlan(tp=4, pp=2), 33), (ServePlan(tp=4), 700)):
        ctx = _ctx(plan)
        parts = decode_breakdown(ctx, batch=batch, context=1500)
        assert sum(parts.values()) == pytest.approx(decode_time(ctx, batch=batch, context=1500), rel=1e-9)
    # Above the largest CUDA graph the launches are asynchronous: a 70B layer's kernels outlast them
    assert decode_breakdown(_ctx(ServePlan(tp=4)), batch=700, context=1500)["launches"] == 0.0
    # A small model's batch of one: every kernel takes at least the launch floor, its norms, activation, adds and
    # RoPE included (engine_small_kernels), so the eager launches, one floor each, no longer outlast them
    eager = replace(catalog.engine("vllm"), cuda_graph_max_batch=0)
    small = step_context(catalog.model("small-llama"), H100X8.pools[0], ServePlan(tp=1), eager, CONSTS)
    parts = decode_breakdown(small, batch=1, context=100)
    floor = small.model.n_layers * engine_small_kernels(small.model.blocks[0].layer) * small.calib.launch_s
    assert parts["elementwise"] == pytest.approx(floor) and parts["launches"] == 0.0
    assert sum(parts.values()) == pytest.approx(decode_time(small, batch=1, context=100), rel=1e-9)


def test_experts_touched_closed_form():
    assert experts_touched(256, 256, 8, 1) == pytest.approx(8)
    assert experts_touched(32, 256, 8, 1) == pytest.approx(1)
    assert experts_touched(256, 256, 8, 10_000) == pytest.approx(256)
    ds = catalog.model("deepseek-v3")
    small = decode_time(_ctx(ServePlan(tp=8, ep=8, precision="fp8"), model=ds), batch=1, context=1000)
    big = decode_time(_ctx(ServePlan(tp=8, ep=8, precision="fp8"), model=ds), batch=256, context=1000)
    assert big > 2 * small  # a batch of 1 reads 8 of 256 experts per layer, a batch of 256 nearly all


def _pred(**kw) -> ServePrediction:
    base = dict(ttft=1.0, tpot=0.02, itl=0.02, e2e=3.0, queue_wait=0.5, output_tokens_per_s=1.0, requests_per_s=1.0,
                resident=8, kv_capacity_tokens=1000, kv_occupancy=0.5, limited_by="load", decode_step=0.015,
                prefill=0.3)
    return ServePrediction(**{**base, **kw})


@settings(max_examples=40, deadline=None)
@given(p=st.floats(0.05, 0.95), fixed=st.floats(0, 0.4))
def test_wait_quantiles_average_to_the_mean_wait(p, fixed):
    pred = _pred(wait_fixed=fixed, wait_prob=p)
    n = 20_000
    mean = sum(wait_quantile(pred, (i + 0.5) / n) for i in range(n)) / n
    assert mean == pytest.approx(pred.queue_wait, rel=2e-3)
    assert wait_quantile(pred, 1 - p) == pytest.approx(fixed)  # nobody above the busy share waits extra


def test_itl_tail_is_the_step_with_a_prefill():
    pred = _pred(stall=0.3, stall_share=0.02, tpot=0.015 + 0.02 * 0.3, itl=0.015 + 0.02 * 0.3)
    assert quantile(pred, "itl", 0.5) == pytest.approx(0.015)
    assert quantile(pred, "itl", 0.99) == pytest.approx(0.315)
    assert quantile(pred, "tpot", 0.99) == pred.tpot
    assert math.isclose(quantile(pred, "e2e", 0.5) - quantile(pred, "ttft", 0.5), pred.e2e - pred.ttft)


def test_unmeetable_slo_names_the_nearest_option():
    res = search(_request(slo=Slo(ttft=0.05, tpot=0.01)))
    assert res.best is None
    why = explain(res)
    assert any(line.startswith("looser SLO") for line in why.nearest)
    # 2048 clients queue for minutes on 8 GPUs: a lighter load, or more GPUs, meets a 300 ms TTFT
    res = search(_request(work=replace(WORK, concurrency=2048), slo=Slo(ttft=0.3)))
    assert res.best is None
    nearest = explain(res).nearest
    assert any(line.startswith("--concurrency") for line in nearest)
    assert any(line.startswith("32xh100-sxm meets") for line in nearest)


def _cli(*args: str) -> subprocess.CompletedProcess:
    """``meshplan serve ARGS`` in this process (what the console script runs: ``cli.main``), its streams captured."""
    import contextlib
    import io

    from meshplan.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["serve", *args])
    return subprocess.CompletedProcess(["meshplan", "serve", *args], code, out.getvalue(), err.getvalue())


BASE = ("--model", "llama3.1-70b", "--gpus", "8xh100-sxm", "--input-len", "1000", "--output-len", "500")


@pytest.mark.parametrize("extra, needle", [
    (("--engine", "vlm"), "vllm"),
    (("--percentile", "p0"), "--percentile"),
    (("--ep", "2"), "no experts"),
    (("--tp", "16"), "exceeds the 8 GPUs"),
    (("--concurrency", "4", "--rate", "2"), "not both"),
    (("--kv-dtype", "int4"), "--kv-dtype"),
    (("--precision", "fp4"), "FP4 tensor cores"),          # H100 has none: the GPUs that do are named
    (("--precision", "int3"), "--precision"),
    (("--objective", "speed"), "objective"),
    (("--ttft-ms", "-5"), "--ttft-ms"),
    (("--disagg", "maybe"), "disagg"),
    (("--price", "-1"), "--price"),
    (("--input-len", "0"), "--input-len"),
    (("--percentile", "p100"), "--percentile"),
    (("--export", "out"), "--checkpoint"),
    (("--export", "/nonexistent/dir/out", "--checkpoint", "x/y"), "--export"),
    (("--model", "llama3.1-70bb"), "llama3.1-70b"),
    (("--attn-dp", "2"), "no experts"),
    (("--model", "mixtral-8x7b", "--engine", "tgi", "--attn-dp", "2"), "no data-parallel attention"),
    (("--model", "mixtral-8x7b", "--tp", "4", "--attn-dp", "4"), "must fit one node"),
    (("--attn-dp", "-1"), "--attn-dp"),
    (("--model", "mixtral-8x7b", "--tp", "1", "--attn-dp", "2", "--ep", "8"), "must divide the tp x attn_dp"),
    (("--model", "mixtral-8x7b", "--ep", "3"), "must divide mixtral-8x7b's 8 experts"),
])
def test_serve_bad_input_is_one_line(extra, needle):
    proc = _cli(*BASE, *extra)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_serve_cli_exit_codes():
    ok = _cli(*BASE, "--concurrency", "32", "--ttft-ms", "1000", "--tpot-ms", "50", "--json")
    assert ok.returncode == 0, ok.stderr
    miss = _cli(*BASE, "--concurrency", "32", "--tpot-ms", "1")
    assert miss.returncode == 4 and "NOTHING MEETS THE SLOs" in miss.stdout and "looser SLO" in miss.stdout


def test_regimes_pick_tp_for_latency_and_pp_or_replicas_for_throughput():
    # The dense-LLM deployment study's rule: a tight per-token SLO at low load wants the widest TP; an offline
    # (throughput) load wants PP or replicas over every GPU, not one wide TP group (issue 14). On 8 H100 tp2 x pp4
    # and two tp4 replicas are within 10 %: pipelining keeps one copy of the weights, so more KV cache.
    latency = search(_request(work=Workload(input_len=1000, output_len=200, concurrency=1), slo=Slo(tpot=0.015)))
    assert latency.best.plan.tp == 8 and latency.best.plan.replicas == 1
    assert any(c.plan.tp == 4 and "TPOT" in " ".join(c.misses) for c in latency.candidates)  # tp4 is too slow
    offline = search(_request(work=Workload(input_len=1000, output_len=1000), slo=Slo(tpot=0.1), disagg="off"))
    best = offline.best
    assert best.plan.tp < 8 and (best.plan.pp > 1 or best.plan.replicas > 1) and best.gpus == 8
    assert best.pred.limited_by in ("kv cache", "max_num_seqs")


def test_variable_lengths_average_the_prefill_and_bias_the_resident_output():
    from meshplan.cli.serve import lengths
    from meshplan.cost.serve_load import mean_prefill
    from meshplan.cost.serve_step import prefill_time
    from meshplan.spec.serving import workload_from_hist

    assert lengths("--input-len", "128:3,512:1") == ((128, 3.0), (512, 1.0))
    w = workload_from_hist(((100, 1), (300, 1)), ((50, 3), (250, 1)), concurrency=8)
    assert (w.input_len, w.output_len) == (200, 100)
    # a resident request is length-biased: E[O^2] / E[O] = (3 * 50^2 + 250^2) / (3 * 50 + 250)
    assert w.resident_output == pytest.approx((3 * 2500 + 62500) / 400)
    assert w.mean_context == pytest.approx(200 + w.resident_output / 2)
    assert w.longest == 300 + 250
    ctx = _ctx(ServePlan(tp=4))
    want = 0.5 * prefill_time(ctx, tokens=100) + 0.5 * prefill_time(ctx, tokens=300)
    assert mean_prefill(ctx, w) == pytest.approx(want)


def test_prefills_batch_up_to_the_step_budget():
    from meshplan.cost.serve_load import prompts_per_step
    from meshplan.cost.serve_step import prefill_time

    ctx = _ctx(ServePlan(tp=4))
    work = Workload(input_len=128, output_len=128)
    assert prompts_per_step(ctx, work, 1024) == 8  # 1024 resident / 128 steps per cycle; 8192 // 128 = 64 fit
    assert prompts_per_step(ctx, Workload(input_len=4096, output_len=16), 1024) == 2  # the 8192 budget holds 2
    assert prompts_per_step(ctx, work, 64) == 1
    # batching shares the weight reads: 8 prompts in one step cost less than 8 steps of one
    assert prefill_time(ctx, tokens=128, prompts=8) < 8 * prefill_time(ctx, tokens=128)


@pytest.mark.parametrize("text", ["0", "abc", "128:0", "5:x", "-3"])
def test_lengths_refuse_bad_values(text):
    from meshplan.cli.serve import lengths
    from meshplan.errors import SpecError

    with pytest.raises(SpecError, match="--input-len"):
        lengths("--input-len", text)


def test_a_model_no_layout_holds_names_the_gpus_that_would():
    res = search(_request(model=catalog.model("llama3.1-405b"), cluster=catalog.cluster("4xh100-sxm"),
                          work=Workload(input_len=1000, output_len=1000)))
    assert not res.candidates and res.infeasible
    # 405.9e9 x 2 bytes = 756 GiB: 8 x 80 GB cannot hold it with a KV cache, 16 can
    assert explain(res).nearest[0].startswith("16xh100-sxm holds it")
    proc = _cli("--model", "llama3.1-405b", "--gpus", "4xh100-sxm", "--input-len", "100", "--output-len", "100")
    assert proc.returncode == 4 and "NOTHING FITS" in proc.stdout and "16xh100-sxm holds it" in proc.stdout


@pytest.mark.parametrize("args, needle", [(("--device", "cuda"), "CPU processes"),
                                          (("--model", "tiny-gpt"), "RoPE")])
def test_check_serve_refuses_what_it_cannot_run_in_one_line(args, needle, capsys):
    from meshplan.cli import main

    code = main(["check", "--serve", *args])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err


def test_a_benchmark_sized_engine_runs_as_built_and_a_pinned_cap_stays():
    """trtllm-bench builds the engine for the workload: every candidate runs (and exports) the caps its build
    heuristics give that layout, a cap the search tries applies below them, and a cap the user pins is kept."""
    from meshplan.cost.serve_sizing import sized_engine

    work = Workload(input_len=128, output_len=2048)
    req = _request(engine=catalog.engine("trtllm-0.17"), work=work, slo=Slo(), precision="fp8", kv_dtype="fp8",
                   disagg="off")
    res = search(req)
    for c in res.candidates:
        plan = replace(c.plan, replicas=1)
        built = sized_engine(req.engine, LLAMA70, plan, H100X8.pools[0], work)
        assert c.engine.max_batched_tokens == built.max_batched_tokens
        assert c.engine.max_num_seqs == (min(c.seq_cap, built.max_num_seqs) if c.seq_cap else built.max_num_seqs)
    pinned = search(replace(req, max_num_seqs=4000, tp=8))
    assert {c.engine.max_num_seqs for c in pinned.candidates} == {4000}


def test_the_winner_says_what_its_exported_benchmark_should_report():
    """A closed loop's winner carries the replay of bench.sh (10 requests per client, all clients starting
    together); its tokens/s agree with the steady state, its TTFT is higher: 64 clients of 1000-token prompts fill
    vLLM's 8,192-token budget in groups of eight, each sharing one prefill. An offline request has no such run."""
    res = search(_request())
    why = explain(res)
    b = why.benchmark
    assert b["requests"] == 640 and b["clients"] == 64
    assert b["output_tokens_per_s"] == pytest.approx(res.best.pred.output_tokens_per_s, rel=0.10)
    assert b["ttft_ms"] > 2 * 1e3 * res.best.pred.ttft
    assert any("exported benchmark" in line and "stay in step" in line for line in why.limits)
    offline = explain(search(_request(work=replace(WORK, concurrency=0), slo=Slo())))
    assert offline.benchmark == {}


def test_the_winner_says_how_much_poisson_load_it_holds_within_the_slos():
    """The rate is the sustainable one of serve_capacity: at it the p90 TTFT and TPOT hold the SLOs."""
    from meshplan.cost.serve_capacity import sustainable_rate
    from meshplan.search.serve_explain import CAPACITY_STEPS

    res = search(_request())
    line = next(s for s in explain(res).limits if s.startswith("under Poisson arrivals"))
    ctx = step_context(LLAMA70, H100X8.pools[0], replace(res.best.plan, replicas=1), res.best.engine, CONSTS)
    cap = sustainable_rate(ctx, WORK, replicas=res.best.plan.replicas, ttft=1.0, tpot=0.04, q=0.9,
                           iterations=CAPACITY_STEPS)
    assert f"{cap.rate:,.2f} requests/s" in line and cap.rate > 0
    assert quantile(cap.prediction, "tpot", 0.9) <= 0.04 and quantile(cap.prediction, "ttft", 0.9) <= 1.0
    free = explain(search(_request(slo=Slo())))
    assert not any(s.startswith("under Poisson arrivals") for s in free.limits)


def test_a_moe_layer_launches_its_router_besides_the_small_kernels():
    """Fused norms (2), activation, residual adds (2) and RoPE (2), plus top-k, block alignment and the expert sum,
    plus MLA's absorbed path (two more norms, two copies, one more BMM): at a batch of one a DeepSeek-V3 MoE layer's
    small kernels take fifteen launch floors, however few their bytes."""
    dsv3 = catalog.model("deepseek-v3")
    moe = next(b.layer for b in dsv3.blocks if b.layer.moe)
    dense = catalog.model("llama3.1-8b").blocks[0].layer
    assert (engine_small_kernels(moe), engine_small_kernels(dense)) == (15, 7)
    ctx = step_context(dsv3, catalog.cluster("8xh200").pools[0], ServePlan(tp=8, ep=8, precision="fp8"),
                       catalog.engine("sglang"), CONSTS)
    parts = decode_breakdown(ctx, batch=1, context=1000)
    assert parts["elementwise"] >= 61 * 7 * ctx.calib.launch_s


def test_few_tokens_ride_a_swapped_tile_so_a_low_compute_gpu_still_decodes_at_its_bandwidth():
    """H20 has H100's memory system and a seventh of its tensor rate: a decode batch of up to 16 tokens pads to 16
    rows (vLLM's swap-AB tiles), not to the training fit's ~100, so one client's step reads the weights at the
    HBM rate and fp8 weights halve it."""
    from meshplan.cost.compute import shape_eff, swapped_rows

    calib = step_context(LLAMA70, H100X8.pools[0], ServePlan(tp=8), catalog.engine("vllm"), CONSTS).calib
    assert [swapped_rows(m) for m in (1, 16, 17, 32, 33, 64)] == [16, 16, 32, 32, 64, 64]
    assert shape_eff(8, 1e9, 1e9, calib, few_rows=True) == pytest.approx(0.5, rel=1e-6)
    assert shape_eff(200, 1e9, 1e9, calib, few_rows=True) == shape_eff(200, 1e9, 1e9, calib)  # the fit above 64
    pool = catalog.cluster("1xh20").pools[0]
    qwen = catalog.model("qwen3-32b")
    t = {p: decode_time(step_context(qwen, pool, ServePlan(tp=1, precision=p), catalog.engine("vllm"), CONSTS),
                        batch=1, context=1000) for p in ("bf16", "fp8")}
    weights = 2 * 32.8e9 / (pool.gpu.hbm_bandwidth * CONSTS["decode_mem_eff"]["hopper"])  # 32.8B (model card)
    assert t["bf16"] == pytest.approx(weights, rel=0.25) and t["fp8"] == pytest.approx(t["bf16"] / 2, rel=0.25)
