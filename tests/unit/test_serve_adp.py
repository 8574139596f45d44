"""Data-parallel attention inside a serving replica (``ServePlan.attn_dp``, ``cost/serve_adp.py``): where its
bytes live, what a step costs, when the search picks it, and what refuses it."""

from __future__ import annotations

import pytest

from meshplan import catalog
from meshplan.calibrate.serve_constants import load_constants
from meshplan.cost.comm import collective_time, plan_links
from meshplan.cost.memory import layer_params
from meshplan.cost.serve_adp import probes
from meshplan.cost.serve_load import kv_capacity_tokens, predict_load
from meshplan.cost.serve_memory import attention_params, kv_bytes_per_token_per_gpu, weight_bytes_per_gpu
from meshplan.cost.serve_step import decode_breakdown, decode_time, step_context
from meshplan.errors import SpecError
from meshplan.search.serve import search
from meshplan.search.serve_request import ServeRequest
from meshplan.spec.serving import ServePlan, Workload

DS = catalog.model("deepseek-v3")
H200 = catalog.cluster("8xh200")
CONSTS = load_constants()
TP8 = ServePlan(tp=8, ep=8, precision="fp8", engine="sglang")
DP8 = ServePlan(tp=1, attn_dp=8, ep=8, precision="fp8", engine="sglang")


def ctx_of(plan: ServePlan):
    return step_context(DS, H200.pools[0], plan, catalog.engine("sglang"), CONSTS)


def test_each_group_holds_the_attention_and_all_gpus_share_the_rest():
    """attention / tp + (other dense + experts) / (tp x attn_dp) per layer, tables as before; with attn_dp = 1
    the layer sum is every parameter over tp, as it always was."""
    tables = weight_bytes_per_gpu(DS, TP8) - sum(sum(layer_params(b.layer)) / 8 for b, _ in DS.layers())
    layers = sum(attention_params(b.layer) + (sum(layer_params(b.layer)) - attention_params(b.layer)) / 8
                 for b, _ in DS.layers())
    # tp=1 keeps whole embedding tables (tp=8 a vocab slice each): compare the layers alone
    dp_tables = weight_bytes_per_gpu(DS, DP8) - layers
    assert dp_tables == pytest.approx(8 * tables, rel=1e-9)
    # MLA's projections: q 7168x1536 + 1536x128x192, kv 7168x576 + 512x128x256, o 128x128x7168 = 187.2M a layer
    assert attention_params(DS.decoder) == 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + \
        128 * 128 * 7168


def test_mla_s_latent_is_stored_once_per_group_not_once_per_rank():
    """TP replicates MLA's latent on every rank; eight attention groups each keep their own requests' latents."""
    assert kv_bytes_per_token_per_gpu(DS, TP8) == kv_bytes_per_token_per_gpu(DS, DP8)
    assert kv_capacity_tokens(ctx_of(DP8)) > 4 * kv_capacity_tokens(ctx_of(TP8))


def test_a_decode_step_reads_an_eighth_of_the_cache_and_gathers_the_tokens():
    """256 sequences: each GPU reads the KV of its group's 32 (TP8: all 256); the feed-forward layers see all 256
    tokens, all-gathered and reduce-scattered over the eight GPUs (no TP all-reduce at tp = 1)."""
    tp8, dp8 = (decode_breakdown(ctx_of(p), batch=256, context=2000) for p in (TP8, DP8))
    assert dp8["attention"] == pytest.approx(tp8["attention"] / 8, rel=0.02)
    ctx = ctx_of(DP8)
    ffn = probes(DS, DP8, 2000)[1]
    link = plan_links(ffn, H200.pools[0]).tp
    nbytes = ctx.engine.graph_batch(32) * 8 * DS.hidden * 2
    one = sum(collective_time(k, nbytes, size=8, link=link, calib=ctx.calib) for k in ("all_gather",
                                                                                       "reduce_scatter"))
    assert dp8["allreduce"] == pytest.approx(sum(1 for _ in DS.layers()) * one, rel=1e-9)


def test_latency_takes_tensor_parallel_attention_and_throughput_data_parallel():
    """The trade the engines document (SGLang: data-parallel attention for large batches of MLA models): one
    client decodes faster on TP8 attention, a thousand clients get more tokens/s from eight attention groups,
    whose caches hold all of them."""
    def best(concurrency: int, objective: str):
        req = ServeRequest(model=DS, cluster=H200, engine=catalog.engine("sglang"), precision="fp8",
                           work=Workload(input_len=1000, output_len=1000, concurrency=concurrency),
                           objective=objective, disagg="off", constants=CONSTS)
        return search(req).best
    assert best(1, "latency").plan.attn_dp == 1
    busy = best(1024, "throughput")
    assert busy.plan.attn_dp > 1 and busy.pred.limited_by == "load"
    tp8 = predict_load(ctx_of(TP8), Workload(input_len=1000, output_len=1000, concurrency=1024))
    assert tp8.limited_by == "kv cache" and busy.pred.output_tokens_per_s > 1.3 * tp8.output_tokens_per_s
    assert decode_time(ctx_of(DP8), batch=1, context=1000) > decode_time(ctx_of(TP8), batch=1, context=1000)


@pytest.mark.parametrize("kw, field", [(dict(tp=1, attn_dp=2, pp=2), "serve.attn_dp"),
                                       (dict(tp=1, attn_dp=4, ep=8), "serve.ep"),
                                       (dict(tp=2, attn_dp=2, ep=3), "serve.ep")])
def test_a_layout_data_parallel_attention_cannot_run_names_its_field(kw, field):
    with pytest.raises(SpecError, match=field):
        ServePlan(**kw)


def test_engines_without_it_are_never_offered_it():
    req = ServeRequest(model=DS, cluster=H200, engine=catalog.engine("vllm-0.6"), precision="fp8",
                       work=Workload(input_len=1000, output_len=1000, concurrency=256), constants=CONSTS)
    assert all(c.plan.attn_dp == 1 for c in search(req).candidates)
    trt = ServeRequest(model=DS, cluster=H200, engine=catalog.engine("trtllm"), precision="fp8",
                       work=Workload(input_len=1000, output_len=1000, concurrency=256), constants=CONSTS)
    # TensorRT-LLM's enable_attention_dp gives every rank its own attention: groups of one GPU only
    assert {c.plan.tp for c in search(trt).candidates if c.plan.attn_dp > 1} == {1}
