"""Lower bounds never exceed the full cost model, and the pipeline factors match the closed forms by hand."""

import dataclasses

import pytest

from meshplan import catalog
from meshplan.cost.estimate import estimate
from meshplan.search import prune
from meshplan.search.bounds import (
    layer_table,
    memory_lower_bound,
    mixed_pipeline_floor,
    mixed_schedule_bound,
    pipeline_factor,
    static_lower_bound,
    time_lower_bound,
)
from meshplan.search.evaluate import split
from meshplan.search.request import SearchRequest
from meshplan.search.space import Degrees, Leaf, leaf_plan
from meshplan.search.state import CostCache, SearchSpace

# Megatron-style physics with every registered schedule allowed, so each bound meets each schedule.
ANY_SCHEDULE = dataclasses.replace(catalog.framework("megatron-core"),
                                   schedules=("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zbv", "dualpipev"))


def test_pipeline_factors_by_hand():
    assert pipeline_factor("1f1b", pp=4, vpp=1, n_micro=8) == 11.0          # m + p - 1
    assert pipeline_factor("interleaved_1f1b", pp=4, vpp=3, n_micro=8) == 9.0   # m + (p - 1) / v
    assert pipeline_factor("interleaved_1f1b", pp=4, vpp=2, n_micro=2) == pytest.approx(2 + 1.5 + 1.0)
    assert pipeline_factor("zb_h1", pp=4, vpp=1, n_micro=8, share=0.5) == 9.5  # m + share (p - 1)
    assert pipeline_factor("zbv", pp=4, vpp=2, n_micro=8, share=0.5) == 8.75   # halved fill
    assert pipeline_factor("", pp=1, vpp=1, n_micro=8) == 8.0


@pytest.mark.parametrize("pp,vpp,sched,zero,mb", [(1, 1, "", 1, 2), (2, 1, "1f1b", 1, 1),
                                                  (4, 2, "interleaved_1f1b", 3, 1),
                                                  (4, 1, "zb_h1", 1, 2), (2, 2, "zbv", 3, 1), (4, 1, "gpipe", 0, 1),
                                                  (1, 1, "", 3, 4), (2, 1, "1f1b", 3, 4)])
def test_bounds_below_estimate(pp, vpp, sched, zero, mb):
    model, cluster = catalog.model("llama2-13b"), catalog.cluster("32xa100-80gb")
    req = SearchRequest(global_batch=64, seq_len=4096, framework=ANY_SCHEDULE)
    deg = Degrees(tp=2, cp=1, pp=pp, dp=16 // pp, ep=1, etp=1)
    plan = leaf_plan(Leaf(deg=deg, micro_batch=mb, schedule=sched, vpp=vpp, zero=zero, dp_shard=0, cp_kind="ring"),
                     req)
    table = layer_table(model, cluster.pools[0], plan, stack=ANY_SCHEDULE)
    est = estimate(model, cluster, plan, stack=ANY_SCHEDULE)
    assert time_lower_bound(table, plan) <= est.step_time
    assert static_lower_bound(table, plan) <= est.peak_memory
    assert memory_lower_bound(table, plan, mode="none") <= est.peak_memory * (1 + 1e-9)


def test_mixed_pipeline_floor_by_hand():
    # Two ranks doing all layers in 1 s and 3 s: shares 0.75 / 0.25 take 0.75 s each.
    assert mixed_pipeline_floor([1.0, 3.0], [0.0, 0.0], [0.0, 0.0]) == pytest.approx(0.75)
    # A 0.5 s head on the second rank: (1 + 0.5 / 3) / (1 + 1/3) = 0.875 s.
    assert mixed_pipeline_floor([1.0, 3.0], [0.0, 0.5], [0.0, 0.0]) == pytest.approx(0.875)
    # A rank that must hold a layer of 2 s dominates.
    assert mixed_pipeline_floor([1.0, 30.0], [0.0, 0.0], [0.0, 2.0]) == 2.0


@pytest.mark.parametrize("sched,vpp", [("zb_h1", 1), ("1f1b", 1), ("interleaved_1f1b", 2)])
def test_mixed_leaf_bound_below_estimate_with_unlike_blocks(sched, vpp):
    # LLaVA's vision and language blocks slow down by different factors on a V100 (no bf16 tensor cores): the
    # bound must use the smallest per-block slowdown, not the whole model's.
    model, cluster = catalog.model("llava-1.5-7b"), catalog.cluster("8xa100-80gb+8xv100")
    req = SearchRequest(global_batch=16, seq_len=2048, simulate=False, framework=ANY_SCHEDULE)
    space = SearchSpace.of(model, cluster, req)
    cache = CostCache(space=space)
    var = next(v for v in space.variants if v.describe() == "8xv100+8xa100-80gb")
    deg = Degrees(tp=8, cp=1, pp=2, dp=1, ep=1, etp=1)
    plan = leaf_plan(Leaf(deg=deg, micro_batch=1, schedule=sched, vpp=vpp, zero=0, dp_shard=0, cp_kind="ring"), req)
    bound = prune.leaf_bound(space, cache, var, plan, 80e9)
    est = estimate(model, var, plan.with_(layer_split=split(space, cache, var, plan)), stack=ANY_SCHEDULE)
    assert bound <= est.step_time


def test_mixed_schedule_bound_by_hand():
    # 1F1B: m M + (S - M) with M = max(1.5, 2 / 2) = 1.5 s, S = 2 s, m = 8: 7 x 1.5 + 2 = 12.5 s.
    assert mixed_schedule_bound("1f1b", pp=2, vpp=1, n_micro=8, share=0.5, busiest=1.5, total=2.0) == 12.5
    # Interleaved v = 2: (8 - 1/2) x 1.5 + 2 / 2 = 12.25 s; m < p adds (v - 1)(p - m) M / v.
    assert mixed_schedule_bound("interleaved_1f1b", pp=2, vpp=2, n_micro=8, share=0.5, busiest=1.5,
                                total=2.0) == 12.25
    assert mixed_schedule_bound("interleaved_1f1b", pp=4, vpp=2, n_micro=2, share=0.5, busiest=1.0,
                                total=2.0) == pytest.approx(1.5 * 1.0 + 0.5 * 2.0 + 0.5 * 2 * 1.0)
    # ZB-V: c = share / 2 = 0.25; the average (S / p = 3) beats the busiest floor (1): 7.75 x 3 + 0.25 x 6.
    assert mixed_schedule_bound("zbv", pp=2, vpp=2, n_micro=8, share=0.5, busiest=1.0, total=6.0) == 24.75


@pytest.mark.parametrize("sched", ["zbv", "dualpipev"])
def test_v_shaped_even_split_bound_counts_the_head_on_rank_zero(sched):
    # V-shaped schedules put the last stage (and the head's compute, which hides gradient traffic) on rank 0;
    # the bound once took rank 0's data-parallel tail from the wrong stages and overstated it by ~0.5 %.
    model, cluster = catalog.model("gpt-1.7b"), catalog.cluster("8xh100-sxm")
    req = SearchRequest(global_batch=32, seq_len=2048, simulate=False, framework=ANY_SCHEDULE)
    space = SearchSpace.of(model, cluster, req)
    deg = Degrees(tp=1, cp=1, pp=2, dp=4, ep=1, etp=1)
    plan = leaf_plan(Leaf(deg=deg, micro_batch=1, schedule=sched, vpp=2, zero=0, dp_shard=0, cp_kind="ring"), req)
    bound = prune.leaf_bound(space, CostCache(space=space), space.variants[0], plan, 80e9)
    assert bound <= estimate(model, cluster, plan, stack=ANY_SCHEDULE).step_time


def test_fsdp_single_micro_batch_static_bound_has_no_gradients():
    # FSDP2 with one micro-batch: at the peak (start of the backward) no gradients exist yet, so the static
    # bound is fp32 weights (4 B) and Adam states (8 B) over the 8 shards, plus the context.
    model, cluster = catalog.model("llama2-13b"), catalog.cluster("8xa100-80gb")
    req = SearchRequest(global_batch=8, seq_len=256)
    deg = Degrees(tp=1, cp=1, pp=1, dp=8, ep=1, etp=1)
    plan = leaf_plan(Leaf(deg=deg, micro_batch=1, schedule="", vpp=1, zero=3, dp_shard=0, cp_kind="ring"), req)
    table = layer_table(model, cluster.pools[0], plan, stack=req.framework)
    assert static_lower_bound(table, plan) == pytest.approx(table.dense * (4 + 8) / 8 + table.reserved)
    assert memory_lower_bound(table, plan, mode="none") <= estimate(model, cluster, plan).peak_memory
