"""Invariants of the cost model under random layouts (hypothesis)."""

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan import catalog
from meshplan.cost.estimate import estimate
from meshplan.spec.checks import plan_violations
from meshplan.spec.cluster import ClusterSpec, Pool
from meshplan.spec.plan import Plan

MODEL = catalog.model("llama3-8b")
GPU = catalog.gpu("h100-sxm")

layouts = st.builds(
    dict, tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4]), cp=st.sampled_from([1, 2]),
    zero=st.sampled_from([0, 1, 3]), recompute=st.sampled_from(["none", "selective", "full"]),
    micro_batch=st.sampled_from([1, 2]), sp=st.booleans())


def cluster(gpu=GPU, n=64):
    return ClusterSpec(pools=(Pool(gpu=gpu, n_gpus=n, gpus_per_node=8),))


def plan_of(kw, n=64):
    dp = n // (kw["tp"] * kw["pp"] * kw["cp"])
    return Plan(global_batch=256, seq_len=4096, dp=dp, **kw)


@settings(max_examples=40, deadline=None)
@given(layouts, st.floats(min_value=1.5, max_value=8.0))
def test_more_bandwidth_is_never_slower(kw, factor):
    p = plan_of(kw)
    if plan_violations(MODEL, cluster(), p):
        return
    fast = dataclasses.replace(GPU, nic_bandwidth=GPU.nic_bandwidth * factor,
                               intra_bandwidth=GPU.intra_bandwidth * factor)
    assert estimate(MODEL, cluster(fast), p).step_time <= estimate(MODEL, cluster(), p).step_time + 1e-12


@settings(max_examples=40, deadline=None)
@given(layouts)
def test_more_tp_never_needs_more_parameter_memory(kw):
    p = plan_of(kw)
    if kw["tp"] == 8 or plan_violations(MODEL, cluster(), p):
        return
    q = plan_of({**kw, "tp": kw["tp"] * 2})
    if plan_violations(MODEL, cluster(), q):
        return
    assert estimate(MODEL, cluster(), q).memory.params <= estimate(MODEL, cluster(), p).memory.params


@settings(max_examples=30, deadline=None)
@given(layouts)
def test_recompute_trades_time_for_memory(kw):
    p = plan_of({**kw, "recompute": "none"})
    if plan_violations(MODEL, cluster(), p):
        return
    none, full = estimate(MODEL, cluster(), p), estimate(MODEL, cluster(), p.with_(recompute="full"))
    assert full.memory.activations <= none.memory.activations
    assert full.step_time >= none.step_time


@settings(max_examples=30, deadline=None)
@given(layouts)
def test_time_breakdown_is_consistent(kw):
    p = plan_of(kw)
    if plan_violations(MODEL, cluster(), p):
        return
    e = estimate(MODEL, cluster(), p)
    assert abs(e.time.total() - e.step_time) < 1e-9 * e.step_time
    assert all(v >= 0 for v in e.time.as_dict().values())
    assert 0 < e.mfu < 1
