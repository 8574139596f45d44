"""Chunked prefill beside the decodes (Sarathi-Serve's piggybacking): a mixed iteration reads the weights once for
both sets of rows, the token budget caps the decoding set at B O / (O + I), and the mean iteration is the share of
mixed iterations between the decode-only and the mixed one."""

from dataclasses import replace

import pytest

from meshplan import catalog
from meshplan.calibrate.serve_constants import load_constants
from meshplan.cost.serve_chunked import chunked_state
from meshplan.cost.serve_load import steady_state
from meshplan.cost.serve_step import decode_time, mixed_time, prefill_time, step_context
from meshplan.spec.serving import ServePlan, Workload

MODEL = catalog.model("llama3.1-70b")
POOL = catalog.cluster("8xh100-sxm").pools[0]


def _ctx(engine: str = "trtllm-0.17", **changes):
    eng = replace(catalog.engine(engine), **changes)
    plan = ServePlan(tp=2, precision="fp8", kv_dtype="fp8", engine=eng.name)
    return step_context(MODEL, POOL, plan, eng, load_constants())


def test_a_mixed_iteration_hides_the_decodes_weight_reads():
    ctx = _ctx()
    mixed = mixed_time(ctx, batch=64, context=2000, chunk=2048, seq=2048)
    apart = decode_time(ctx, batch=64, context=2000) + prefill_time(ctx, tokens=2048)
    alone = prefill_time(ctx, tokens=2048)
    assert alone < mixed < apart
    # What the piggybacked decodes still cost is their KV reads and their rows in the compute-bound GEMMs, far less
    # than a decode step, which is mostly the weight read.
    assert mixed - alone < 0.5 * decode_time(ctx, batch=64, context=2000)


def test_the_token_budget_caps_the_decoding_set():
    ctx = _ctx(max_batched_tokens=4096)
    work = Workload(input_len=2048, output_len=128)
    st = chunked_state(ctx, work, resident=1000)
    assert st.decoding == int(4096 * 128 / (128 + 2048))  # B O / (O + I) = 240
    # Every iteration carries the prompts that replace the 240 / 128 finishing sequences: 3840 tokens, within the
    # room of 4096 - 240 (the cap's rounding leaves a few tokens spare).
    assert st.chunk == 240 * 2048 // 128 <= 4096 - st.decoding
    assert st.share == pytest.approx(1.0) and st.iteration == pytest.approx(st.t_mixed)
    roomy = chunked_state(_ctx(max_batched_tokens=1 << 20), work, resident=1000)
    assert roomy.decoding == 1000


def test_the_mean_iteration_sits_between_decode_only_and_mixed():
    ctx = _ctx()
    work = Workload(input_len=1000, output_len=1000, concurrency=64)
    st = chunked_state(ctx, work, resident=64)
    assert st.chunk == 1000 and st.share == pytest.approx(64 / 1000)  # one prompt per mixed iteration
    assert st.t_decode < st.iteration < st.t_mixed
    t_d, t_p, cycle, tpot = steady_state(ctx, work, 64)
    # A decoding request waits on the 63 other prompts of its cycle, not on its own (prefilled before it decodes)
    assert tpot == pytest.approx(st.t_decode + 63 / 64 * (st.iteration - st.t_decode))
    assert t_p == st.first and cycle == pytest.approx(1000 * st.iteration)


def test_a_single_client_decodes_without_prefill_stalls():
    """One client: its next prompt comes after its last token, so no chunk shares its decode steps (the replay of
    the same run agrees); the cycle still carries the prompt's iterations."""
    ctx = _ctx()
    work = Workload(input_len=20000, output_len=100, concurrency=1)
    st = chunked_state(ctx, work, resident=1)
    t_d, t_p, cycle, tpot = steady_state(ctx, work, 1)
    assert tpot == st.t_decode < st.iteration
    assert cycle == pytest.approx(100 * st.iteration)


def test_an_engine_that_does_not_mix_runs_prefill_steps_of_their_own():
    ctx = _ctx(mixed_batches=False)
    work = Workload(input_len=1000, output_len=1000, concurrency=64)
    t_d, t_p, cycle, tpot = steady_state(ctx, work, 64)
    assert t_d == decode_time(ctx, batch=64, context=work.mean_context)
    assert tpot == pytest.approx(t_d + 63 * t_p / 1000)  # (R - 1) prefill steps spread over O tokens


def test_under_pp_every_batch_in_flight_has_the_budget():
    eng = replace(catalog.engine("trtllm-0.17"), max_batched_tokens=4096)
    work = Workload(input_len=2048, output_len=128)
    for pp in (1, 2, 4):
        plan = ServePlan(tp=2, pp=pp, precision="fp8", kv_dtype="fp8", engine=eng.name)
        st = chunked_state(step_context(MODEL, POOL, plan, eng, load_constants()), work, resident=4000)
        assert st.decoding == int(pp * 4096 * 128 / (128 + 2048))


def test_a_mixed_engine_that_cannot_split_a_prompt_runs_it_whole():
    # TRT-LLM without chunked context: a 6000-token prompt joins an iteration whose spare budget is smaller, whole.
    work = Workload(input_len=6000, output_len=100)
    whole = chunked_state(_ctx(chunked_prefill=False, max_batched_tokens=8192), work, resident=64)
    split = chunked_state(_ctx(max_batched_tokens=8192), work, resident=64)
    assert whole.chunk >= 6000 and whole.first == pytest.approx(whole.t_mixed)
    assert split.chunk <= 8192 - split.decoding


def test_a_queue_of_short_prompts_drains_a_roomful_per_iteration():
    """The waiting prompts ride together in the next iteration's room (budget less the decodes), so a queue of
    200-token prompts drains (8192 - 250) // 200 = 39 per iteration: 250 clients on a cache that holds them all
    wait for about one iteration, not for 250 prompts served one after another."""
    from meshplan.cost.serve_load import predict_load

    ctx = _ctx("nim-1.8")
    work = Workload(input_len=200, output_len=200, concurrency=250)
    st = chunked_state(ctx, work, resident=250)
    assert st.decoding == 250 and st.prompts == (8192 - 250) // 200
    pred = predict_load(ctx, work)
    assert pred.resident == 250 and pred.limited_by == "load"
    assert pred.queue_wait < st.t_mixed and not pred.queue_dominated
    # A 5000-token prompt fills the room alone: the queue drains one prompt per iteration.
    assert chunked_state(ctx, Workload(input_len=5000, output_len=500), resident=8).prompts == 1
