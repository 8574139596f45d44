"""RL phase switch (``replan --phase generate``): the serving planner's engine layouts on the training GPUs, each
with the weights-only refit priced by the same transition model as the published refits, the least refit +
generation time chosen."""

from __future__ import annotations

import json

import pytest

from meshplan import catalog
from meshplan.calibrate.serve_constants import load_constants
from meshplan.calibrate.transition_fit import load_anchors, price
from meshplan.cli import main
from meshplan.cost.state_layout import state_groups
from meshplan.cost.transition_time import SwitchCosts, fitted_overhead
from meshplan.search.phase import plan_generation
from meshplan.search.serve_request import ServeRequest
from meshplan.spec.plan import Plan
from meshplan.spec.serving import Workload

QWEN = catalog.model("qwen3-4b")
H100X8 = catalog.cluster("8xh100-sxm")


def _request(**pins) -> ServeRequest:
    return ServeRequest(model=QWEN, cluster=H100X8, engine=catalog.engine("vllm"), disagg="off",
                        work=Workload(input_len=1024, output_len=512, concurrency=128), constants=load_constants(),
                        **pins)


def _generation(plan: Plan, **pins):
    return plan_generation(QWEN, H100X8, plan, serve=_request(**pins), stack=catalog.framework("megatron-core"),
                           costs=SwitchCosts(groups_prebuilt=True))


def test_the_refit_is_priced_as_the_published_nemo_rl_refit():
    # NeMo-RL Qwen3-4B DP8 -> TP8 on H100 (0.21-0.34 s): the engine pinned to one TP8 replica is that switch, and
    # the planner prices it with the anchors' own function.
    anchor = next(a for a in load_anchors() if a["model"] == "qwen3-4b")
    res = _generation(Plan(global_batch=256, seq_len=4096, dp=8, zero=1), tp=8, replicas=1)
    (opt,) = res.options
    want = price(anchor, fitted_overhead("hopper")).time.total_s
    assert opt.time.total_s == pytest.approx(want, rel=1e-9)
    assert anchor["measured"][0] <= opt.time.total_s <= anchor["measured"][1]


def test_only_weights_move_and_the_choice_is_the_least_refit_plus_generation():
    res = _generation(Plan(global_batch=256, seq_len=4096, tp=2, pp=2, dp=2, zero=1))
    assert res.options and res.choice == min(range(len(res.options)), key=lambda i: res.options[i].total_s)
    weights = 2.0 * sum(t.elems * (t.slot_hi - t.slot_lo) for t in state_groups(QWEN))  # one 16-bit copy
    for o in res.options:
        assert set(o.bytes.by_kind) == {"w16"}  # no master weights, no moments
        assert o.bytes.moved <= o.candidate.plan.replicas * weights
        assert o.generate_s == pytest.approx(128 * 512 / o.candidate.pred.output_tokens_per_s)
    assert len({(o.candidate.plan.tp, o.candidate.plan.pp) for o in res.options}) == len(res.options)


@pytest.fixture
def qwen_plan(tmp_path):
    path = tmp_path / "a.toml"
    path.write_text('model = "qwen3-4b"\ngpus = "8xh100-sxm"\n[plan]\nglobal_batch = 256\nseq_len = 4096\n'
                    "dp = 8\nzero = 1\n")
    return path


def test_phase_cli_json(qwen_plan, capsys):
    assert main(["replan", "--from", str(qwen_plan), "--phase", "generate", "--rollouts", "64", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["phase"] == "generate" and doc["rollouts"] == 64 and doc["back_to_training_s"] == 0.0
    best = doc["options"][doc["choice"] - 1]
    assert best["total_s"] == min(o["total_s"] for o in doc["options"])
    assert best["total_s"] == pytest.approx(best["refit_s"] + best["generate_s"])


@pytest.mark.parametrize("args, field", [
    (["--phase", "gen"], "--phase"),
    (["--phase", "generate", "--lose", "1"], "same GPUs"),
    (["--phase", "generate", "--out", "x.toml"], "--out"),
    (["--phase", "generate", "--engine", "vlm"], "did you mean"),
    (["--phase", "generate", "--min-gain", "0.1"], "--min-gain"),
    (["--phase", "generate", "--prebuilt-groups"], "--prebuilt-groups"),
    # the old 0.8 default was indistinguishable from a pin of 0.8, which the phase then ignored
    (["--phase", "generate", "--max-memory-fraction", "0.8"], "--max-memory-fraction"),
    (["--rollouts", "64"], "only with --phase generate"),
    (["--engine", "sglang"], "only with --phase generate"),
])
def test_bad_phase_input_is_one_line(qwen_plan, capsys, args, field):
    assert main(["replan", "--from", str(qwen_plan), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err


def test_shipped_switch_overheads_are_the_fit_of_the_published_switches():
    """transition_constants.toml is what the fit script writes from the anchors (no hand edits)."""
    from meshplan.calibrate.transition_fit import constants_text, fit
    from meshplan.cost.transition_time import _fitted_table

    anchors = load_anchors()
    n = sum(1 for a in anchors if a.get("role") == "fit")
    shipped = _fitted_table()
    assert shipped and {g: (o.fixed_s, o.per_tensor_s) for g, o in shipped.items()} == {
        g: (float(f"{o.fixed_s:.4g}"), float(f"{o.per_tensor_s:.4g}")) for g, o in fit(anchors).items()}
    assert "Do not edit by hand" in constants_text(fit(anchors), n)
