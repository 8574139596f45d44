"""The pruned search returns the exhaustive optimum on small spaces (one pool and mixed pools), honours pins,
and reports nothing-fits with the GPUs needed."""

import json

import pytest

from meshplan import catalog
from meshplan.errors import SpecError
from meshplan.report.search import render_text, result_json
from meshplan.search import SearchRequest, search


def _best(model, gpus, gb, seq, **kw):
    return search(catalog.model(model), catalog.cluster(gpus),
                  SearchRequest(global_batch=gb, seq_len=seq, simulate=False, top=1, **kw))


@pytest.mark.parametrize("model,gpus,gb,seq", [("llama3-8b", "8xh100-sxm", 64, 4096),
                                               ("tiny-moe", "8xh100-sxm", 32, 2048),
                                               ("llama2-7b", "4xa100-80gb+4xh100-sxm", 16, 4096)])
def test_pruned_equals_exhaustive(model, gpus, gb, seq):
    fast = _best(model, gpus, gb, seq)
    full = _best(model, gpus, gb, seq, exhaustive=True)
    assert fast.best.estimate.step_time == pytest.approx(full.best.estimate.step_time, rel=1e-12)
    assert fast.evaluated < full.evaluated / 5
    assert sum(fast.pruned.values()) > 0


def test_uneven_shares_found_and_exact_when_pipelines_are_pinned_off():
    # Without pipelining, dp replicas on both pools: the H100 replicas take ~3x the A100's micro-batches.
    fast = _best("gpt-1.7b", "8xa100-80gb+8xh100-sxm", 64, 2048, pins={"pp": 1})
    full = _best("gpt-1.7b", "8xa100-80gb+8xh100-sxm", 64, 2048, pins={"pp": 1}, exhaustive=True)
    p = fast.best.plan
    assert p.batch_shares == (1, 3) and p.rank_order.split("-")[-1] in ("dp", "pp")
    assert 8 // (p.tp * p.cp) * sum(p.batch_shares) * p.micro_batch == 64   # 8 GPUs per pool / replica size
    assert fast.best.estimate.step_time == pytest.approx(full.best.estimate.step_time, rel=1e-12)
    assert "shares 1:3" in render_text(fast)
    h100 = _best("gpt-1.7b", "8xh100-sxm", 64, 2048, pins={"pp": 1})
    assert fast.best.estimate.step_time < 0.9 * h100.best.estimate.step_time


def test_mixed_cluster_never_slower_than_its_pools():
    both = _best("llama2-7b", "8xa100-80gb+8xh100-sxm", 32, 4096)
    h100 = _best("llama2-7b", "8xh100-sxm", 32, 4096)
    assert both.best.estimate.step_time <= h100.best.estimate.step_time * (1 + 1e-12)


def test_pins_are_honoured():
    res = _best("llama2-13b", "32xa100-80gb", 128, 4096, pins={"tp": 4, "pp": 2, "schedule": "1f1b"})
    p = res.best.plan
    assert (p.tp, p.pp, p.schedule) == (4, 2, "1f1b")


def test_optimizer_precision_reaches_every_plan_and_frees_memory():
    # Megatron's precision-aware optimizer: bf16 gradients and moments on every candidate; the same pinned layout
    # then needs less memory, and an unknown dtype is refused.
    pins = {"tp": 2, "pp": 2, "micro_batch": 1, "recompute": "none", "zero": 1}
    fp32 = _best("llama2-13b", "32xa100-80gb", 128, 4096, pins=pins).best
    stack = catalog.framework("megatron-core").with_(grad_dtype="bf16", optimizer_dtype="bf16")
    half = _best("llama2-13b", "32xa100-80gb", 128, 4096, pins=pins, framework=stack).best
    assert half.plan == fp32.plan  # the same layout, under another stack setting
    assert half.estimate.peak_memory < fp32.estimate.peak_memory
    with pytest.raises(SpecError, match="grad_dtype"):
        catalog.framework("megatron-core").with_(grad_dtype="fp16")


def test_nothing_fits_reports_leanest_and_gpus_needed():
    res = _best("llama3-70b", "8xa100-80gb", 16, 4096)
    assert res.best is None and res.infeasible.kind == "memory"
    need = res.infeasible.details["min_gpus"]
    assert need > 8 and need % 8 == 0
    assert "smallest cluster that fits" in res.infeasible.reason
    assert "NOTHING FITS" in render_text(res)


def test_json_document_has_counts():
    res = search(catalog.model("llama3-8b"), catalog.cluster("16xh100-sxm"),
                 SearchRequest(global_batch=64, seq_len=4096, top=3))
    doc = json.loads(json.dumps(result_json(res)))
    assert set(doc) >= {"plans", "considered", "pruned", "search_time_s"}
    assert len(doc["plans"]) == 3 and doc["considered"] >= sum(doc["pruned"].values())
    steps = [p["step_time_s"] for p in doc["plans"]]
    assert steps == sorted(steps)


def test_front_holds_the_winner_and_times_every_member_as_the_table():
    """One time per plan: each front member with a pipeline is simulated like the table's rows, and the winner
    (nothing is faster) is on the front."""
    res = search(catalog.model("llama3-70b"), catalog.cluster("64xh100-sxm"),
                 SearchRequest(global_batch=128, seq_len=8192, pins={"pp": 4}, top=3))
    assert res.front and res.front[0].plan == res.best.plan
    for rp in res.front:
        assert rp.simulated is not None
        assert rp.step_time >= res.best.step_time
    times = [rp.step_time for rp in res.front]
    mems = [rp.best.peak_memory for rp in res.front]
    assert times == sorted(times) and mems == sorted(mems, reverse=True)


def test_pins_are_checked_before_the_search():
    from meshplan.errors import PlanError

    model, cluster = catalog.model("llama3-8b"), catalog.cluster("8xh100-sxm")
    with pytest.raises(SpecError, match="pin zero"):
        search(model, cluster, SearchRequest(global_batch=8, seq_len=4096, pins={"zero": 5}))
    with pytest.raises(PlanError, match="32 attention heads"):
        search(model, cluster, SearchRequest(global_batch=8, seq_len=4096, pins={"tp": 3}))
    # A pinned schedule asks for a pipeline: every plan has pp > 1.
    res = search(model, cluster, SearchRequest(global_batch=16, seq_len=4096, pins={"schedule": "1f1b"},
                                               simulate=False))
    assert res.plans and all(rp.plan.pp > 1 and rp.plan.schedule_name == "1f1b" for rp in res.plans)


def test_zero_over_one_rank_is_replication():
    from meshplan.spec.plan import Plan

    assert Plan(global_batch=8, seq_len=64, dp=8, zero=3, dp_shard=1).zero == 0
    assert Plan(global_batch=8, seq_len=64, dp=8, zero=3, dp_shard=8).dp_shard == 0
    assert Plan(global_batch=8, seq_len=64, dp=1, cp=2, zero=1).zero == 1  # ZeRO over the cp ranks is real
    res = _best("llama3-8b", "16xh100-sxm", 64, 4096, exhaustive=True)
    assert all(not (rp.plan.zero and rp.plan.zero_group == 1) for rp in res.fitting)
