"""Live layout switches inside one torchrun world: after each switch every parameter and AdamW moment is bit-equal
to the same switch done through a DCP checkpoint, the losses that follow equal the single-process reference,
and the bytes moved are the transition model's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from runtime_helpers import PG_TIMEOUT_S, TOL, check_ok, launch

from meshplan.runtime.config import RunConfig
from meshplan.runtime.train import reference_losses
from meshplan.spec.plan import Plan

pytestmark = pytest.mark.runtime


def _plan(**kw) -> Plan:
    return Plan(global_batch=4, seq_len=32, precision="fp32", **kw)


# Each layout switches to the next: FSDP, TP+SP, PP (2 and 4 stages, two schedules, an uneven split), CP, HSDP,
# TP+CP, DDP.
DENSE = (
    dict(dp=4, zero=3),
    dict(tp=2, sp=True, dp=2, zero=1),
    dict(pp=2, dp=2, zero=1, schedule="1f1b"),
    dict(pp=4, schedule="gpipe"),
    dict(pp=2, dp=2, zero=1, layer_split=(1, 3), schedule="1f1b"),  # an uneven split, as the planner makes them
    dict(cp=2, dp=2, zero=3),
    dict(dp=4, zero=3, dp_shard=2),
    dict(tp=2, sp=True, cp=2),
    dict(dp=4, zero=0),
)
MOE = (  # expert parallelism changes: ep 2 -> 4 -> tp2 with experts over tp -> back to FSDP only
    dict(dp=4, ep=2, zero=1),
    dict(dp=4, ep=4, zero=3),
    dict(tp=2, sp=True, dp=2, ep=2, zero=1),
    dict(dp=4, zero=3),
)


def _chain(tmp: Path, name: str, model: str, layouts: tuple) -> RunConfig:
    plans = [_plan(**kw) for kw in layouts]
    switches = tuple({"step": i + 1, "plan": p.to_dict(), "check": True} for i, p in enumerate(plans[1:]))
    return RunConfig(plan=plans[0], model=model, steps=len(plans) + 1, out_dir=str(tmp / name),
                     timeout_s=PG_TIMEOUT_S, switches=switches)


def _lines(cfg: RunConfig) -> list[dict]:
    return [json.loads(x) for x in (Path(cfg.out_dir) / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def chains(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("switch")
    cfgs = [_chain(tmp, "dense", "tiny-llama", DENSE), _chain(tmp, "moe", "tiny-moe", MOE)]
    check_ok(launch(cfgs, nproc=4, tmp=tmp, timeout=420))
    return cfgs


@pytest.mark.parametrize("which", [0, 1], ids=["dense", "moe"])
def test_every_switch_equals_the_checkpoint_route_and_keeps_the_reference_loss(chains, which):
    cfg = chains[which]
    lines = _lines(cfg)
    switches = [r for r in lines if "switch" in r]
    assert len(switches) == len(cfg.switches) and all("error" not in s for s in switches), switches
    assert all(s["bit_equal"] for s in switches), [(s["from"], s["to"]) for s in switches if not s["bit_equal"]]
    got = [r["loss"] for r in lines if "step" in r and "switch" not in r and not r.get("summary")]
    ref = reference_losses(RunConfig(plan=cfg.plan, model=cfg.model, steps=cfg.steps))
    assert len(got) == cfg.steps
    assert max(abs(a - b) for a, b in zip(got, ref)) < TOL, (got, ref)


@pytest.mark.parametrize("which", [0, 1], ids=["dense", "moe"])
def test_moved_bytes_are_the_transition_models(chains, which):
    """The runtime's own plan of messages and the analytic geometry agree on the bytes within 2 % (replicated
    norms are the difference: the geometry keeps them whole, the runtime shards them with FSDP)."""
    for s in (r for r in _lines(chains[which]) if "switch" in r):
        assert s["bytes"] == pytest.approx(s["predicted_bytes"], rel=0.02, abs=4096), s


def _plan_file(path: Path, model: str = "tiny-llama", **kw) -> Path:
    lines = [f'model = "{model}"', "[plan]", "global_batch = 4", "seq_len = 32", 'precision = "fp32"']
    lines += [f"{k} = {str(v).lower() if isinstance(v, bool) else (repr(v) if isinstance(v, str) else v)}"
              .replace("'", '"') for k, v in kw.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_cli_switch_with_check(tmp_path):
    """``meshplan run --switch B.toml@1 --switch-check``: the run switches live and reports bit-equality."""
    from meshplan.cli import main

    a = _plan_file(tmp_path / "a.toml", dp=4, zero=3)
    b = _plan_file(tmp_path / "b.toml", tp=2, sp=True, pp=2, schedule="1f1b")
    out = tmp_path / "out"
    assert main(["run", "--plan", str(a), "--switch", f"{b}@1", "--switch-check", "--steps", "2",
                 "--out", str(out), "--timeout", str(PG_TIMEOUT_S)]) == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    sw = [r for r in rows if "switch" in r]
    assert len(sw) == 1 and sw[0]["bit_equal"]
    assert {k: sw[0]["to"][k] for k in ("tp", "sp", "pp")} == {"tp": 2, "sp": True, "pp": 2}


@pytest.mark.parametrize("target, field", [
    ("b.toml@2", "before the last step"),
    ("b.toml", "PLAN.toml@STEP"),
    ("missing.toml@1", "is not a plan file"),
    ("other.toml@1", "is a plan of tiny-moe"),
    ("wide.toml@1", "the world has 4"),
])
def test_bad_switches_are_refused_before_any_process(tmp_path, capsys, target, field):
    from meshplan.cli import main

    a = _plan_file(tmp_path / "a.toml", dp=4, zero=3)
    _plan_file(tmp_path / "b.toml", tp=2, dp=2)
    _plan_file(tmp_path / "other.toml", model="tiny-moe", dp=4)
    _plan_file(tmp_path / "wide.toml", dp=8)
    assert main(["run", "--plan", str(a), "--switch", str(tmp_path / target), "--steps", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err
