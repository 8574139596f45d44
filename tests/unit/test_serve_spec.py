"""Speculative decoding in the serving model: Leviathan et al.'s expected tokens per pass and its inverse, the
verifying pass and the drafter's cost on the step model, the drafter's weights and KV cache, the load layer and the
replayed benchmark dividing a pass by what it yields, and the flags and refusals of ``meshplan serve``."""

from __future__ import annotations

import statistics
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan import catalog
from meshplan.calibrate.serve_constants import load_constants
from meshplan.cli import main
from meshplan.cost.memory import layer_params
from meshplan.cost.serve_chunked import chunked_state
from meshplan.cost.serve_load import predict_load
from meshplan.cost.serve_memory import kv_bytes_per_token, kv_bytes_per_token_per_gpu, weight_bytes_per_gpu
from meshplan.cost.serve_spec import draft_time
from meshplan.cost.serve_step import decode_time, head_time, layer_time, step_context
from meshplan.errors import SpecError
from meshplan.sim.serve_run import benchmark_run
from meshplan.spec.serving import ServePlan, Workload
from meshplan.spec.speculation import Speculation, acceptance_for, draft_layer

EAGLE = Speculation(method="eagle", draft_tokens=3, acceptance=0.7, checkpoint="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")
NGRAM = Speculation(method="ngram", draft_tokens=4, acceptance=0.5)


def ctx_for(model="llama3.1-8b", gpus="8xh100-sxm", tp=1, engine="vllm", spec=None, **plan):
    pool = catalog.cluster(gpus).pools[0]
    return step_context(catalog.model(model), pool, ServePlan(tp=tp, engine=engine, speculation=spec, **plan),
                        catalog.engine(engine), load_constants())


def test_tokens_per_pass_is_leviathan_eq_1():
    assert EAGLE.tokens_per_pass == pytest.approx(1 + 0.7 + 0.49 + 0.343)  # (1 - a^4) / (1 - a)
    assert replace(EAGLE, acceptance=0.0).tokens_per_pass == 1.0 and EAGLE.verify_rows == 4


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 8), st.floats(0.0, 0.98))
def test_acceptance_length_inverts_tokens_per_pass(k, a):
    length = Speculation(method="ngram", draft_tokens=k, acceptance=a).tokens_per_pass
    assert acceptance_for(length, k) == pytest.approx(a, abs=1e-6)


@pytest.mark.parametrize("kw, field", [
    ({"method": "medusa"}, "speculation.method"), ({"draft_tokens": 0}, "speculation.draft_tokens"),
    ({"acceptance": 1.0}, "speculation.acceptance"), ({"method": "draft"}, "speculation.draft"),
])
def test_bad_speculation_names_the_field(kw, field):
    with pytest.raises(SpecError, match=field.replace(".", r"\.")):
        Speculation(**({"method": "ngram", "draft_tokens": 3, "acceptance": 0.5} | kw))
    with pytest.raises(SpecError, match="pp = 1"):
        ServePlan(pp=2, speculation=NGRAM)
    with pytest.raises(SpecError, match="--accept-length"):
        acceptance_for(4.0, 3)


def test_the_drafter_costs_its_layer_and_the_head_per_draft_token():
    ctx = ctx_for(spec=EAGLE)
    layer = draft_layer(ctx.model, EAGLE)
    assert layer.in_hidden == 2 * ctx.model.hidden and layer.moe is None
    rows = ctx.engine.graph_batch(6)
    one = layer_time(ctx, layer, tokens=rows, seq=900, kv_tokens=6 * 900) + head_time(ctx, rows)
    assert draft_time(ctx, batch=6, context=900) == pytest.approx(3 * one)
    assert draft_time(ctx_for(spec=NGRAM), batch=6, context=900) == 0.0  # n-gram lookup: host only


def test_a_memory_bound_pass_verifies_k_plus_one_tokens_for_about_the_price_of_one():
    """At batch 1 a 70B decode step streams its weights; four rows a sequence barely add to it, so n-gram
    speculation (no device drafting) divides TPOT by nearly its tokens per pass."""
    base, spec = ctx_for("llama3.1-70b", tp=8), ctx_for("llama3.1-70b", tp=8, spec=NGRAM)
    ratio = decode_time(spec, batch=1, context=1500) / decode_time(base, batch=1, context=1500)
    assert 1.0 < ratio < 1.15
    w = Workload(input_len=1000, output_len=500, concurrency=1)
    tpot, tpot_spec = predict_load(base, w).tpot, predict_load(spec, w).tpot
    assert tpot_spec == pytest.approx(tpot * ratio / NGRAM.tokens_per_pass, rel=0.03)


def test_speculation_stops_paying_when_the_batch_is_compute_bound():
    """Verifying k + 1 rows a sequence is free only while weights dominate: at a few hundred sequences a
    low-acceptance drafter costs throughput."""
    w_lo, w_hi = (Workload(input_len=1000, output_len=500, concurrency=c) for c in (1, 512))
    base, spec = ctx_for("llama3.1-70b", tp=8), ctx_for("llama3.1-70b", tp=8, spec=replace(NGRAM, acceptance=0.2))
    assert predict_load(spec, w_lo).tpot < predict_load(base, w_lo).tpot
    assert predict_load(spec, w_hi).output_tokens_per_s < predict_load(base, w_hi).output_tokens_per_s


def test_streamed_chunks_carry_a_pass_worth_of_tokens():
    pred = predict_load(ctx_for(spec=EAGLE), Workload(input_len=500, output_len=200, concurrency=8))
    assert pred.itl == pytest.approx(EAGLE.tokens_per_pass * pred.tpot)


def test_the_drafter_adds_its_weights_and_its_cache():
    base, spec = ctx_for(tp=2), ctx_for(tp=2, spec=EAGLE)
    layer = draft_layer(base.model, EAGLE)
    dense, expert = layer_params(layer)
    added = weight_bytes_per_gpu(spec.model, spec.plan) - weight_bytes_per_gpu(base.model, base.plan)
    assert added == pytest.approx((dense + expert) / 2 * 2.0, rel=1e-9)  # bf16, all of it split over tp 2
    kv_added = kv_bytes_per_token_per_gpu(spec.model, spec.plan) - kv_bytes_per_token_per_gpu(base.model, base.plan)
    assert kv_added == pytest.approx(kv_bytes_per_token(layer, 2.0) / 2)
    draft = Speculation(method="draft", draft_tokens=3, acceptance=0.6, draft=catalog.model("llama3.2-1b"))
    with_model = ctx_for("llama3.1-70b", tp=8, spec=draft, engine="sglang")
    plain = replace(with_model.plan, speculation=None)
    assert weight_bytes_per_gpu(with_model.model, with_model.plan) == pytest.approx(
        weight_bytes_per_gpu(with_model.model, plain) + weight_bytes_per_gpu(draft.draft, plain))


def test_a_chunked_budget_holds_the_verify_rows_and_the_faster_turnover():
    """Each decoding sequence takes k + 1 of the step's tokens and finishes tau / O of itself a step, so
    n_d (k + 1 + tau I / O) <= budget."""
    ctx, w = ctx_for(spec=EAGLE), Workload(input_len=1000, output_len=100, concurrency=4096)
    budget = ctx.engine.max_batched_tokens
    st_ = chunked_state(ctx, w, 4096)
    tau = EAGLE.tokens_per_pass
    assert st_.decoding == int(budget / (4 + tau * 1000 / 100)) and st_.tokens_per_pass == tau


def test_the_replayed_benchmark_agrees_with_the_steady_state():
    ctx, w = ctx_for("llama3.1-70b", tp=8, spec=EAGLE), Workload(input_len=1000, output_len=300, concurrency=16)
    run = benchmark_run(ctx, w, replicas=1)
    assert statistics.fmean(run.tpot) == pytest.approx(predict_load(ctx, w).tpot, rel=0.1)
    assert sum(1 for _ in run.tpot) == len(run.e2e)


SERVE = ["serve", "--model", "llama3.1-8b", "--gpus", "2xh100-sxm", "--input-len", "1000", "--output-len", "200",
         "--concurrency", "4"]


@pytest.mark.parametrize("extra, needle", [
    (["--speculative", "eagle", "--draft-model", "x/EAGLE3-y"], "give one"),
    (["--speculative", "eagle", "--acceptance", "0.6"], "--draft-model"),
    (["--speculative", "eagle", "--acceptance", "0.6", "--accept-length", "2"], "give one"),
    (["--speculative", "ngram", "--accept-length", "5"], "below 4"),
    (["--speculative", "mtp", "--acceptance", "0.8"], "ships no multi-token-prediction"),
    (["--speculative", "draft", "--acceptance", "0.6", "--draft-model", "qwen3-4b", "--engine", "sglang"],
     "share the target's tokenizer"),
    (["--speculative", "draft", "--acceptance", "0.6", "--draft-model", "llama3.2-1b"], "use sglang, trtllm"),
    (["--speculative", "ngram", "--acceptance", "0.6", "--engine", "vllm-0.6.0"], "runs no speculative decoding"),
    (["--speculative", "ngram", "--acceptance", "0.6", "--pp", "2"], "one pipeline stage"),
    (["--speculative", "medusa", "--acceptance", "0.6"], "must be one of mtp, eagle, ngram, draft"),
    (["--draft-tokens", "4"], "add --speculative"),
    (["--speculative", "draft", "--acceptance", "0.6", "--draft-model", "llama9-1b", "--engine", "sglang"],
     "unknown model"),
    (["--speculative", "ngram", "--acceptance", "0.6", "--draft-model", "x/y"], "drop --draft-model"),
])
def test_speculation_flags_refused_with_the_reason(extra, needle, capsys):
    assert main(SERVE + extra) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_speculating_serve_names_the_drafter_and_its_share(capsys):
    assert main(SERVE + ["--speculative", "eagle", "--accept-length", "2.5", "--draft-model",
                         "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "speculative eagle yuhuili/EAGLE3-LLaMA3.1-Instruct-8B, 3 drafts" in out and "2.50 tokens per pass" in out
    assert "drafting" in out


def test_disaggregated_decode_pools_divide_a_pass_by_its_tokens():
    from meshplan.cost.serve_disagg import predict_disagg

    w = Workload(input_len=1000, output_len=300, concurrency=8)
    pre = ctx_for("llama3.1-70b", tp=4)
    base, spec = ctx_for("llama3.1-70b", tp=4), ctx_for("llama3.1-70b", tp=4, spec=EAGLE)
    plain, fast = (predict_disagg(pre, d, w, n_prefill=1, n_decode=1) for d in (base, spec))
    assert fast.tpot == pytest.approx(fast.decode_step / EAGLE.tokens_per_pass)
    assert fast.tpot < plain.tpot and fast.itl == pytest.approx(fast.decode_step)
    assert fast.tokens_per_pass == EAGLE.tokens_per_pass


def test_the_itl_tail_spreads_a_pass_stall_over_its_tokens():
    from meshplan.cost.serve_tail import quantile

    pred = predict_load(ctx_for(spec=EAGLE), Workload(input_len=2000, output_len=100, concurrency=64))
    assert pred.stall > 0 and pred.stall_share > 0
    per_token_stall = pred.stall / EAGLE.tokens_per_pass
    base = pred.tpot - pred.stall_share * per_token_stall
    gap = base + per_token_stall if pred.stall_share > 0.01 else base
    assert quantile(pred, "itl", 0.99) == pytest.approx(pred.itl / pred.tpot * gap)


@pytest.mark.parametrize("extra, needle", [
    (["--speculative", "ngram", "--acceptance", "0"], None),  # a = 0 is a valid (useless) acceptance
    (["--speculative", "ngram", "--acceptance", "0.5", "--draft-tokens", "0"], "--draft-tokens"),
    (["--speculative", "ngram", "--acceptance", "0.5", "--draft-tokens", "100"], "from 1 to 16"),
    (["--speculative", "ngram", "--accept-length", "nan"], "--accept-length"),
    (["--speculative", "ngram", "--acceptance", "nan"], "speculation.acceptance"),
    (["--speculative", "ngram", "--acceptance", "-1"], "speculation.acceptance"),
])
def test_speculation_numbers_are_checked(extra, needle, capsys):
    code = main(SERVE + extra)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert (code == 0) if needle is None else (code == 2 and needle in err)


def test_a_draft_model_is_smaller_and_runs_at_the_replica_tp(capsys):
    big = ["serve", "--model", "llama3.1-70b", "--gpus", "8xh100-sxm", "--input-len", "1000", "--output-len", "200",
           "--concurrency", "4", "--engine", "sglang", "--speculative", "draft", "--acceptance", "0.6"]
    assert main(big + ["--draft-model", "llama3.1-70b"]) == 2
    assert "smaller" in capsys.readouterr().err
    assert main(big + ["--draft-model", "llama3.2-1b", "--tp", "8"]) == 0  # 32 heads, 8 KV heads: tp 8 divides
    capsys.readouterr()


def test_sglang_runs_ngram_and_draft_models_without_data_parallel_attention(capsys):
    from meshplan.search.serve import search
    from meshplan.search.serve_request import ServeRequest

    req = ServeRequest(model=catalog.model("deepseek-v3"), cluster=catalog.cluster("8xh200"),
                       engine=catalog.engine("sglang"), work=Workload(input_len=1000, output_len=200, concurrency=64),
                       precision="fp8", speculation=NGRAM, constants=load_constants())
    assert all(c.plan.attn_dp == 1 for c in search(req).candidates)
    with pytest.raises(SpecError, match="--attn-dp"):
        replace(req, attn_dp=2)
    mtp = replace(req, speculation=Speculation(method="mtp", draft_tokens=2, acceptance=0.85))
    assert any(c.plan.attn_dp > 1 for c in search(mtp).candidates)


def test_vllm_graphs_count_a_speculating_pass_in_tokens():
    """vLLM captures token counts: 64 sequences of 4 rows replay the 256-token graph; an engine that captures
    requests pads the 64 sequences and runs 4 rows each."""
    from meshplan.cost.serve_step import graph_rows

    vllm, trt = ctx_for(spec=EAGLE), ctx_for(spec=EAGLE, engine="trtllm")
    assert graph_rows(vllm, 61, 4) == (vllm.engine.graph_batch(244), True) and graph_rows(vllm, 200, 4)[1] is False
    assert graph_rows(trt, 61, 4) == (trt.engine.graph_batch(61) * 4, True)


def test_a_budget_bound_chunked_step_shares_its_decodes_among_the_resident():
    """With room for fewer decodes than resident requests, each waits R / n_d iterations a pass: a tighter budget
    is never faster."""
    w = Workload(input_len=1000, output_len=100, concurrency=512)
    spec = replace(EAGLE, draft_tokens=7)
    wide, tight = ctx_for(spec=spec), ctx_for(spec=spec, engine="vllm")
    tight = replace(tight, engine=replace(tight.engine, max_batched_tokens=512))
    assert predict_load(tight, w).tpot > predict_load(wide, w).tpot


def test_the_explanation_weighs_speculation_against_none_at_the_load():
    from meshplan.search.serve import search
    from meshplan.search.serve_explain import explain
    from meshplan.search.serve_request import ServeRequest

    def said(clients: int, spec: Speculation) -> str:
        req = ServeRequest(model=catalog.model("llama3.1-70b"), cluster=catalog.cluster("8xh100-sxm"),
                           engine=catalog.engine("vllm"), tp=8, disagg="off", speculation=spec,
                           work=Workload(input_len=1000, output_len=500, concurrency=clients),
                           constants=load_constants())
        return next(s for s in explain(search(req)).limits if s.startswith("speculation ("))

    assert "does not pay" not in said(1, EAGLE) and "+" in said(1, EAGLE)
    assert "does not pay" in said(256, replace(NGRAM, acceptance=0.2))


def test_the_search_picks_the_draft_length_by_load(capsys):
    """With a per-token acceptance and no pinned length, every length is tried: long drafts for one client (the
    pass is weight-bound), short ones at hundreds (its rows cost compute)."""
    from meshplan.search.serve import search
    from meshplan.search.serve_request import ServeRequest

    def best_k(clients: int) -> int:
        req = ServeRequest(model=catalog.model("llama3.1-70b"), cluster=catalog.cluster("8xh100-sxm"),
                           engine=catalog.engine("vllm"), tp=8, disagg="off", draft_options=(1, 2, 3, 4, 5),
                           speculation=replace(EAGLE, acceptance=0.6), constants=load_constants(),
                           work=Workload(input_len=1000, output_len=500, concurrency=clients))
        return search(req).best.plan.speculation.draft_tokens

    assert best_k(1) > best_k(256) and best_k(256) == 1
    assert main(SERVE + ["--speculative", "ngram", "--acceptance", "0.6"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "1-5 drafts searched at 0.60 acceptance" in out and " k" in out
    assert main(SERVE + ["--speculative", "ngram", "--accept-length", "2.2"]) == 0  # measured at 3: kept at 3
    out = " ".join(capsys.readouterr().out.split())
    assert "3 drafts at" in out and "searched" not in out
    with pytest.raises(SpecError, match="draft_options"):
        ServeRequest(model=catalog.model("llama3.1-8b"), cluster=catalog.cluster("8xh100-sxm"),
                     engine=catalog.engine("vllm"), work=Workload(input_len=10, output_len=10, concurrency=1),
                     draft_options=(2,))
