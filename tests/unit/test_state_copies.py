"""Redundant optimizer state (``Plan.state_copies``): copies of each shard off its node, counted against the
data-parallel replicas that already hold it, priced in memory and in per-step traffic, and used by replan so that
a node loss needs no checkpoint."""

from __future__ import annotations

import json

import pytest

from meshplan import catalog
from meshplan.cli import main
from meshplan.cost.estimate import estimate
from meshplan.spec.checks import plan_violations
from meshplan.spec.plan import Plan

MODEL = catalog.model("llama3-8b")
CLUSTER = catalog.cluster("128xh100-sxm")


def _plan(**kw) -> Plan:
    return Plan(global_batch=kw.pop("global_batch", 960), seq_len=kw.pop("seq_len", 4096), **kw)


def test_copies_count_the_replicas_that_already_hold_the_state():
    assert _plan(tp=2, dp=64, zero=1, state_copies=1).extra_state_copies == 1  # ZeRO over all of dp: none
    assert _plan(dp=128, zero=3, dp_shard=64, state_copies=1).extra_state_copies == 0  # HSDP: 2 replica groups
    assert _plan(dp=128, zero=3, dp_shard=64, state_copies=2).extra_state_copies == 1
    assert _plan(tp=2, dp=64, zero=0, state_copies=3).extra_state_copies == 0  # 64 whole replicas


def test_memory_holds_the_peers_shards_and_the_step_pays_only_what_the_nic_cannot_hide():
    plain, kept = _plan(tp=2, sp=True, dp=64, zero=1), _plan(tp=2, sp=True, dp=64, zero=1, state_copies=2)
    a, b = estimate(MODEL, CLUSTER, plain), estimate(MODEL, CLUSTER, kept)
    assert b.memory.optimizer == pytest.approx(3 * a.memory.optimizer)  # its own shard and two peers'
    assert b.step_time == pytest.approx(a.step_time)  # 2 x 1.5 GB over 50 GB/s hides behind a 2.9 s step
    # A step too short to hide the refresh: each rank sends 2 x its shard (12 bytes per parameter over 64) over a
    # 50 GB/s NIC; at most that much is exposed.
    short_a = estimate(MODEL, CLUSTER, plain.with_(global_batch=64, seq_len=512))
    short_b = estimate(MODEL, CLUSTER, kept.with_(global_batch=64, seq_len=512))
    send = 2 * a.memory.optimizer / CLUSTER.gpu.nic_bandwidth
    assert 0 < short_b.step_time - short_a.step_time <= send * (1 + 1e-9)


def test_copies_need_other_nodes():
    small = catalog.cluster("16xh100-sxm")
    assert any("3 scale-up domains" in v for v in plan_violations(MODEL, small, _plan(dp=16, zero=1, state_copies=2)))
    assert not [v for v in plan_violations(MODEL, small, _plan(dp=16, zero=1, state_copies=1)) if "state_copies" in v]


def _plan_file(tmp_path, copies: int):
    path = tmp_path / f"a{copies}.toml"
    path.write_text('model = "llama3-8b"\ngpus = "128xh100-sxm"\n[plan]\nglobal_batch = 960\nseq_len = 4096\n'
                    f"tp = 2\nsp = true\ndp = 64\nzero = 1\nstate_copies = {copies}\n")
    return path


def test_a_node_loss_with_copies_reads_nothing_from_storage(tmp_path, capsys):
    out = {}
    for copies in (0, 1):
        assert main(["replan", "--from", str(_plan_file(tmp_path, copies)), "--lose-ranks", "16-23", "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        out[copies] = doc["options"][doc["choice"] - 1]
    assert out[0]["lost_bytes"] > 0 and out[0]["recovered_bytes"] == 0 and out[0]["storage_read_s"] > 0
    assert out[1]["lost_bytes"] == 0 and out[1]["recovered_bytes"] == pytest.approx(out[0]["lost_bytes"])
    assert out[1]["storage_read_s"] == 0 and out[1]["switch_s"] < out[0]["switch_s"]
    assert out[1]["plan"]["state_copies"] == 1  # the new layout keeps the job's redundancy


def test_plan_prices_the_copies(capsys):
    args = ["plan", "--model", "llama3-8b", "--gpus", "128xh100-sxm", "--global-batch", "960", "--seq-len", "4096",
            "--tp", "2", "--dp", "64", "--zero", "1", "--json"]
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)["plans"][0]
    assert main(args + ["--state-copies", "1"]) == 0
    kept = json.loads(capsys.readouterr().out)["plans"][0]
    assert kept["plan"]["state_copies"] == 1 and kept["peak_memory_bytes"] > plain["peak_memory_bytes"]


def test_copies_on_a_single_node_are_refused_in_one_line(capsys):
    assert main(["plan", "--model", "llama3-8b", "--gpus", "8xh100-sxm", "--global-batch", "8", "--seq-len", "4096",
                 "--state-copies", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--state-copies" in err and "has 1" in err
