"""meshplan replan: the decision rule, the change flags, the preview and its errors."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from meshplan import catalog
from meshplan.cli import main
from meshplan.errors import SpecError
from meshplan.search.replan import ClusterChange, ReplanRequest, decide, idle_worlds, new_cluster_of
from meshplan.spec.io import parse_gpus
from meshplan.spec.plan_file import read_plan_file


def _opt(step: float, switch: float, remaining: int) -> SimpleNamespace:
    return SimpleNamespace(ranked=SimpleNamespace(step_time=step), time=SimpleNamespace(total_s=switch),
                           horizon_s=switch + remaining * step)


def test_decide_switches_when_the_gain_pays_back_and_reports_break_even():
    rq = ReplanRequest(remaining_steps=1000, min_gain=0.03)
    choice, reason, even = decide((_opt(9.5, 2.0, 1000),), 10.0, "", rq)
    assert choice == 0 and "pays back" in reason
    assert even == pytest.approx(2.0 / 0.5)  # N* = C / (t_A - t_B), elastic note sec. 5


def test_decide_stays_below_min_gain_and_when_the_horizon_is_too_short():
    rq = ReplanRequest(remaining_steps=1000, min_gain=0.1)
    choice, reason, _ = decide((_opt(9.5, 2.0, 1000),), 10.0, "", rq)
    assert choice is None and "--min-gain" in reason
    short = ReplanRequest(remaining_steps=3, min_gain=0.03)
    choice, reason, even = decide((_opt(9.5, 2.0, 3),), 10.0, "", short)
    assert choice is None and even == pytest.approx(4.0) and "stay" in reason


def test_decide_picks_the_least_total_time_when_the_current_layout_cannot_run():
    rq = ReplanRequest(remaining_steps=100)
    fast_dear, slow_cheap = _opt(1.0, 500.0, 100), _opt(1.2, 1.0, 100)
    choice, reason, even = decide((fast_dear, slow_cheap), None, "8 of its 64 GPUs are lost", rq)
    assert choice == 1 and even is None and "cannot run" in reason


def test_idle_worlds_after_a_node_loss():
    assert idle_worlds(16376, 8) == (16368, 16352, 16320, 16256, 16128, 15872, 15360)
    assert idle_worlds(64, 8) == ()


def test_new_cluster_and_bad_changes():
    cl = parse_gpus("64xh100-sxm", catalog.gpu)
    assert new_cluster_of(cl, ClusterChange(lost=(3, 4), added=8)).n_gpus == 70
    with pytest.raises(SpecError, match="--lose"):
        new_cluster_of(cl, ClusterChange(lost=(64,)))
    with pytest.raises(SpecError, match="--add"):
        ClusterChange(added=-1)
    with pytest.raises(SpecError, match="--remaining-steps"):
        ReplanRequest(remaining_steps=-1)


@pytest.fixture(scope="module")
def tiny_plan(tmp_path_factory):
    path = tmp_path_factory.mktemp("replan") / "tiny.toml"
    assert main(["plan", "--model", "tiny-llama", "--gpus", "16xh100-sxm", "--global-batch", "64", "--seq-len",
                 "1024", "--out", str(path)]) == 0
    return path


def test_losing_gpus_forces_a_switch_to_a_layout_on_the_survivors(tiny_plan, tmp_path, capsys):
    out = tmp_path / "new.toml"
    assert main(["replan", "--from", str(tiny_plan), "--lose", "8", "--json", "--out", str(out)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["current"]["cannot_run"] == "8 of its 16 GPUs are lost"
    assert doc["choice"] == 1 and doc["new_gpus"] == "8xh100-sxm"
    opt = doc["options"][0]
    assert opt["switch_s"] >= opt["transfer_s"] >= opt["switch_bound_s"] >= 0
    assert opt["checkpoint_route_s"] > opt["switch_s"]
    assert opt["to_move_bytes"] <= opt["to_move_default_bytes"] + 1e-6
    gpus = opt["rank_map"]["gpu_of_rank"]
    assert len(set(gpus)) == len(gpus) and max(gpus) < 8  # the survivors are GPUs 0..7
    plan, refs = read_plan_file(out)
    assert plan.n_gpus == 8 and refs["gpus"] == "8xh100-sxm"


def test_added_gpus_with_no_gain_keep_the_current_layout(tiny_plan, capsys):
    assert main(["replan", "--from", str(tiny_plan), "--add", "16xh100-sxm", "--min-gain", "0.5"]) == 0
    text = capsys.readouterr().out
    assert "current: tp" in text and "decision: stay" in text


@pytest.mark.parametrize("args, field", [
    (["--lose-ranks", "5-2"], "--lose-ranks"),
    (["--lose", "16"], "--lose"),
    (["--add", "8xa100-80gb"], "--add"),
    (["--min-gain", "1.5"], "--min-gain"),
    (["--old-gpus", "8xh100-sxm"], "--from"),
    (["--model", "llama3-70b"], "--model"),
    (["--storage-gbs", "-1"], "--storage-gbs"),
    (["--max-memory-fraction", "5"], "max_memory_fraction"),
    (["--remaining-steps", "-3"], "--remaining-steps"),
])
def test_bad_input_is_one_line_and_exit_2(tiny_plan, capsys, args, field):
    assert main(["replan", "--from", str(tiny_plan), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err
