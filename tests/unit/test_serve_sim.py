"""The serving event simulation (``sim/serve_sched.py``, ``sim/serve_run.py``): a benchmark run replayed
iteration by iteration, checked against the step model it is built on, against the analytic steady state where
both describe the same thing, and on its own invariants."""

from __future__ import annotations

import dataclasses
import statistics

import pytest

from meshplan import catalog
from meshplan.calibrate.serve_constants import load_constants
from meshplan.cost.serve_load import kv_capacity_tokens, predict_load
from meshplan.cost.serve_step import decode_time, mixed_time, prefill_time, step_context
from meshplan.errors import SpecError
from meshplan.sim.serve_run import BenchRun, simulate_run
from meshplan.spec.serving import ServePlan, Workload


def ctx_of(engine="trtllm", model="llama3.1-8b", gpus="1xh100-sxm", tp=1, precision="bf16", **changes):
    e = dataclasses.replace(catalog.engine(engine), **changes)
    pool = catalog.cluster(gpus).pools[0]
    plan = ServePlan(tp=tp, precision=precision, engine=e.name)
    return step_context(catalog.model(model), pool, plan, e, load_constants())


def test_one_client_waits_for_its_own_prefill_only():
    ctx = ctx_of()
    # 1024 tokens lie on the step-time memo's grid (1/32 of a power of two), so the times are the step model's own
    res = simulate_run(ctx, Workload(input_len=1024, output_len=100, concurrency=1), BenchRun(requests=3, clients=1))
    first = mixed_time(ctx, batch=0, context=0, chunk=1024, seq=1024) + ctx.request_s
    assert res.ttft == pytest.approx((first,) * 3, rel=1e-9)
    # 99 decode passes of one sequence, whose context grows from 1025 to 1123 (memo grid: 1/32 of it)
    step = decode_time(ctx, batch=1, context=1075)
    assert statistics.mean(res.tpot) == pytest.approx(step, rel=0.02)
    assert res.output_tokens == 300 and res.requests == 3


def test_an_engine_without_mixed_batches_runs_a_prefill_step():
    ctx = ctx_of("sglang-0.3.0")
    res = simulate_run(ctx, Workload(input_len=512, output_len=20, concurrency=1), BenchRun(requests=1, clients=1))
    assert res.ttft[0] == pytest.approx(prefill_time(ctx, tokens=512) + ctx.request_s, rel=1e-9)


def test_clients_that_start_together_share_one_prefill():
    """Four 1024-token prompts fit one 8192-token pass: all four wait for all 4096 tokens, and finish together."""
    ctx = ctx_of(max_batched_tokens=8192)
    res = simulate_run(ctx, Workload(input_len=1024, output_len=50, concurrency=4), BenchRun(requests=4, clients=4))
    group = mixed_time(ctx, batch=0, context=0, chunk=4096, seq=1024) + ctx.request_s
    assert res.ttft == pytest.approx((group,) * 4, rel=1e-9)
    assert len(set(res.e2e)) == 1


def test_a_budget_splits_the_wave_into_groups():
    """Twenty 1000-token prompts under a 4096-token budget: four prompts a pass (the chunked fifth starts in the
    same pass), so later groups wait for the earlier ones."""
    ctx = ctx_of(max_batched_tokens=4096)
    res = simulate_run(ctx, Workload(input_len=1000, output_len=50, concurrency=20),
                       BenchRun(requests=20, clients=20))
    ttft = sorted(res.ttft)
    assert ttft[-1] > 4 * ttft[0]
    assert len({round(t, 9) for t in ttft}) >= 5


def test_steady_state_agrees_with_the_analytic_model_under_poisson_arrivals():
    """Spread arrivals are what the analytic request layer assumes: throughput is the offered load, and the token
    time agrees within a few per cent."""
    ctx = ctx_of()
    work = Workload(input_len=512, output_len=256, rate=8.0)
    res = simulate_run(ctx, work, BenchRun(requests=1500, rate=8.0, skip=300, seed=1))
    pred = predict_load(ctx, work)
    assert res.requests_per_s == pytest.approx(8.0, rel=0.08)
    assert statistics.mean(res.tpot) == pytest.approx(pred.tpot, rel=0.08)


def test_offline_throughput_agrees_with_the_analytic_model():
    ctx = ctx_of()
    work = Workload(input_len=128, output_len=512)
    res = simulate_run(ctx, work, BenchRun(requests=3000))
    assert res.output_tokens_per_s == pytest.approx(predict_load(ctx, work).output_tokens_per_s, rel=0.10)


def test_a_closed_loop_beyond_the_kv_cache_queues_as_the_analytic_model_does():
    """70B fp8 on two H100s at 5000/500: the cache holds fewer requests than 250 clients; the wait for admission
    dominates TTFT in both models."""
    ctx = ctx_of("nim-1.8", model="llama3.1-70b", gpus="2xh100-sxm", tp=2, precision="fp8")
    work = Workload(input_len=5000, output_len=500, concurrency=250)
    res = simulate_run(ctx, work, BenchRun(requests=2000, clients=250, skip=750))
    pred = predict_load(ctx, work)
    assert pred.queue_dominated
    assert statistics.mean(res.ttft) == pytest.approx(pred.ttft, rel=0.15)
    assert res.output_tokens_per_s == pytest.approx(pred.output_tokens_per_s, rel=0.05)


def test_a_lazy_engine_preempts_and_recomputes_yet_generates_every_token():
    ctx = ctx_of("vllm", model="llama3.1-70b", gpus="2xh100-sxm", tp=2, precision="fp8")
    cap = kv_capacity_tokens(ctx)
    clients = cap // 3000  # their prompts fit; grown to 6000 tokens, half of them do not
    work = Workload(input_len=3000, output_len=3000, concurrency=clients)
    res = simulate_run(ctx, work, BenchRun(requests=2 * clients, clients=clients))
    assert res.output_tokens == 2 * clients * 3000
    assert all(t > 0 for t in res.tpot)


def test_multi_step_streams_a_round_at_a_time():
    ctx = ctx_of("vllm-0.6.0", gpus="1xa100-80gb")
    res = simulate_run(ctx, Workload(input_len=256, output_len=201, concurrency=2), BenchRun(requests=4, clients=2))
    assert ctx.engine.multi_step == 10
    assert res.mean_itl == pytest.approx(10 * statistics.mean(res.tpot), rel=0.1)


def test_the_same_seed_gives_the_same_run():
    ctx = ctx_of()
    work = Workload(input_len=300, output_len=100, rate=20.0, input_hist=((100, 1.0), (500, 1.0)))
    a = simulate_run(ctx, work, BenchRun(requests=200, rate=20.0, seed=7))
    b = simulate_run(ctx, work, BenchRun(requests=200, rate=20.0, seed=7))
    c = simulate_run(ctx, work, BenchRun(requests=200, rate=20.0, seed=8))
    assert a == b and a != c


@pytest.mark.parametrize("kw, field", [({"requests": 0}, "run.requests"), ({"requests": 5, "skip": 5}, "run.skip"),
                                       ({"requests": 5, "clients": 2, "rate": 1.0}, "run")])
def test_a_bad_run_names_its_field(kw, field):
    with pytest.raises(SpecError, match=field):
        BenchRun(**kw)


def test_the_exported_benchmark_is_the_run_a_release_profile_replays():
    """bench.sh sends 10 requests per client (``serve_common.num_prompts``); replicas share the clients evenly."""
    from meshplan.export.serve_common import num_prompts
    from meshplan.sim.serve_run import benchmark_run

    ctx = ctx_of()
    work = Workload(input_len=512, output_len=64, concurrency=16)
    res = benchmark_run(ctx, work, replicas=2)
    assert res.requests == num_prompts(work) // 2 == 80


def test_a_steady_state_harness_leaves_the_first_wave_out():
    """32 clients that start together: the first wave waits for 32 prompts (four passes of 8192 tokens); a harness
    that reads a steady state (genai-perf's stable windows) does not count it, so its mean TTFT is lower."""
    from meshplan.sim.serve_run import benchmark_run

    work = Workload(input_len=1024, output_len=256, concurrency=32)
    cold = benchmark_run(ctx_of(max_batched_tokens=8192), work, replicas=1)
    warm = benchmark_run(ctx_of(max_batched_tokens=8192, client_warm=True), work, replicas=1)
    assert warm.requests == 6 * 32 and len(warm.ttft) == 4 * 32 and len(cold.ttft) == cold.requests == 320
    assert statistics.mean(warm.ttft) < statistics.mean(cold.ttft)
    assert catalog.engine("nim-1.8").client_warm and "perf_analyzer" in catalog.engine("nim-1.8").sources["client_warm"]
