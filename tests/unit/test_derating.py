"""Derated clusters: a straggler GPU and a degraded link slow the pipeline rank holding them (synchronous training
runs at its slowest member's pace), smaller worlds idle the derated nodes first, and replan weighs keeping a slow
part against leaving it out."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from meshplan import catalog
from meshplan.cli import main
from meshplan.cost.estimate import estimate, rank_pool
from meshplan.errors import SpecError
from meshplan.search.hetero import cluster_variants
from meshplan.search.replan import ClusterChange, new_cluster_of, search_worlds
from meshplan.spec.cluster import Derating
from meshplan.spec.plan import Plan


def _derated(ref: str, **kw):
    return replace(catalog.cluster(ref), derating=Derating(**kw))


def test_bad_deratings_are_refused_with_the_field():
    with pytest.raises(SpecError, match=r"derating.gpus\[3\]"):
        Derating(gpus=((3, 1.5),))
    with pytest.raises(SpecError, match="derating.links"):
        Derating(links=((-1, 0.5),))
    with pytest.raises(SpecError, match="0..63"):
        _derated("64xh100-sxm", gpus=((64, 0.5),))
    with pytest.raises(SpecError, match="one GPU type"):
        _derated("8xh100-sxm+8xa100", gpus=((1, 0.5),))


def test_only_the_pipeline_rank_holding_the_slow_parts_is_derated():
    # tp4 pp4 dp4 in tp-cp-ep-dp-pp order: pipeline rank r holds GPUs 16r..16r+15; GPU 17 and node 3 (GPUs
    # 24-31) are both in pipeline rank 1.
    plan = Plan(global_batch=64, seq_len=4096, tp=4, pp=4, dp=4, zero=1)
    rated = catalog.cluster("64xh100-sxm").pools[0]
    slow = _derated("64xh100-sxm", gpus=((17, 0.5),), links=((3, 0.25),))
    pools = [rank_pool(slow, plan, r) for r in range(4)]
    assert [p.gpu.peak.bf16 / rated.gpu.peak.bf16 for p in pools] == [1.0, 0.5, 1.0, 1.0]
    assert [p.network()[1].bandwidth / rated.network()[1].bandwidth for p in pools] == [1.0, 0.25, 1.0, 1.0]
    assert pools[1].network()[0].bandwidth == rated.network()[0].bandwidth  # NVLink inside the node keeps its rate
    assert pools[0] is slow.pools[0] and rank_pool(slow, plan, 1) is pools[1]  # one object per pace (the search caches)


def test_a_half_speed_gpu_doubles_the_compute_of_a_single_gpu_step():
    # Large GEMMs and flash attention are FLOP-bound: their time is FLOPs / (peak x efficiency), so half the peak
    # doubles them; the memory-bound rest (norms, optimizer) keeps its time.
    model, plan = catalog.model("llama3-8b"), Plan(global_batch=1, seq_len=4096, recompute="full")
    rated = estimate(model, catalog.cluster("1xh100-sxm"), plan)
    slow = estimate(model, _derated("1xh100-sxm", gpus=((0, 0.5),)), plan)
    assert 1.9 < slow.time.compute / rated.time.compute <= 2.0
    assert slow.time.optimizer == pytest.approx(rated.time.optimizer)


def test_a_slow_link_slows_data_parallel_traffic_but_not_tensor_parallel_inside_a_node():
    model = catalog.model("llama3-8b")
    fsdp = Plan(global_batch=64, seq_len=4096, dp=64, zero=3)
    tp_only = Plan(global_batch=8, seq_len=4096, tp=8)
    slow = dict(links=((0, 0.25),))
    assert estimate(model, _derated("64xh100-sxm", **slow), fsdp).step_time > \
        1.05 * estimate(model, catalog.cluster("64xh100-sxm"), fsdp).step_time
    assert estimate(model, _derated("8xh100-sxm", **slow), tp_only).step_time == \
        pytest.approx(estimate(model, catalog.cluster("8xh100-sxm"), tp_only).step_time)


def test_smaller_worlds_idle_the_most_derated_nodes_and_renumber_the_rest():
    d = Derating(gpus=((17, 0.5), (40, 0.9)), links=((7, 0.25),))
    assert d.dropped(64, 56, 8) == {7} and d.dropped(64, 48, 8) == {7, 2}
    assert d.idle(64, 56, 8) == Derating(gpus=((17, 0.5), (40, 0.9)))
    assert d.idle(64, 48, 8) == Derating(gpus=((32, 0.9),))  # node 5 moves to node 4 once node 2 is gone
    assert d.idle(64, 60, 8) == d  # under a node idles: the last ids go
    variants = cluster_variants(replace(catalog.cluster("64xh100-sxm"), derating=d), precision="bf16",
                                allow_idle=True, worlds=(56,))
    assert [v.n_gpus for v in variants] == [64, 56] and variants[1].derating == d.idle(64, 56, 8)


def test_replan_worlds_and_new_cluster_carry_the_derating_in_new_ids():
    change = ClusterChange(lost=tuple(range(8, 16)), slow=Derating(gpus=((17, 0.5),), links=((3, 0.5),)))
    new = new_cluster_of(catalog.cluster("128xh100-sxm"), change)
    assert new.n_gpus == 120 and new.derating == Derating(gpus=((9, 0.5),), links=((2, 0.5),))
    assert search_worlds(new, 8) == (112,)  # a derated node idled (two would leave under 90 %)
    with pytest.raises(SpecError, match="also lost"):
        ClusterChange(lost=(17,), slow=Derating(gpus=((17, 0.5),)))


@pytest.fixture
def plan_8b(tmp_path):
    path = tmp_path / "a.toml"
    path.write_text('model = "llama3-8b"\ngpus = "128xh100-sxm"\n[plan]\nglobal_batch = 960\nseq_len = 4096\n'
                    "tp = 2\nsp = true\ndp = 64\nzero = 1\n")
    return path


def test_a_straggler_is_left_out_when_that_pays(plan_8b, capsys):
    assert main(["replan", "--from", str(plan_8b), "--json"]) == 0
    rated = json.loads(capsys.readouterr().out)["current"]["step_time_s"]
    assert main(["replan", "--from", str(plan_8b), "--slow-gpu", "17:0.5", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["current"]["step_time_s"] > 1.5 * rated and doc["slow_gpus"] == [[17, 0.5]]
    chosen = doc["options"][doc["choice"] - 1]
    idle = set(range(128)) - set(chosen["rank_map"]["gpu_of_rank"])
    assert idle == set(range(16, 24))  # the straggler's node idles
    # leaving it out pays, and costs at most the share of GPUs it idles (the 120 left re-plan their layout)
    assert chosen["step_time_s"] < doc["current"]["step_time_s"] and chosen["step_time_s"] < rated * 128 / 120


@pytest.mark.parametrize("flag, value, field", [
    ("--slow-gpu", "17:1.5", "--slow-gpu"), ("--slow-gpu", "x", "--slow-gpu"), ("--slow-gpu", "500:0.5", "0..127"),
    ("--slow-link", "16:0.5", "0..15"),
])
def test_bad_derating_flags_are_one_line(plan_8b, capsys, flag, value, field):
    assert main(["replan", "--from", str(plan_8b), flag, value]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err


def test_a_cluster_file_carries_its_derating(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[[pools]]\ngpu = "h100-sxm"\nn_gpus = 64\n[derating]\ngpus = [[17, 0.5]]\nlinks = [[3, 0.25]]\n')
    assert catalog.cluster(str(path)).derating == Derating(gpus=((17, 0.5),), links=((3, 0.25),))
    path.write_text('[[pools]]\ngpu = "h100-sxm"\nn_gpus = 64\n[derating]\ngpus = [17, 0.5]\n')
    with pytest.raises(SpecError, match=r"derating.gpus.*\[id, fraction\]"):
        catalog.cluster(str(path))
