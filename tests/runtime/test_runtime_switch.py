"""Live layout switches inside one torchrun world: after each switch every parameter and AdamW moment is bit-equal
to the same switch done through a DCP checkpoint, the losses and gradient norms of every step equal the
single-process reference, and the bytes moved are the transition model's.

The chains also carry every 4-process layout the runtime supports (each trains one step between switches, so a
layout is checked both on its own numerics and as a switch's source and target): HSDP, TP+SP with FSDP or
ZeRO-1 and full recompute, CP ring and all-to-all, another rank order, kv heads replicated over tp, EP over
dp, pp, cp or not in dp, etp, MLA with tp, tied embeddings under pp, and uneven data-parallel batch shares on two
GPU pools (weighted gradient averaging) under HSDP, TP+SP, PP and ZeRO-1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from runtime_helpers import PG_TIMEOUT_S, TOL, check_ok, launch

from meshplan import catalog
from meshplan.runtime.config import RunConfig
from meshplan.runtime.train import reference_rows
from meshplan.spec.checks import replica_shares
from meshplan.spec.plan import Plan

pytestmark = pytest.mark.runtime

NORM_RTOL = 1e-5
"""Largest relative gradient-norm error accepted in fp32 (as test_runtime_layouts)."""


def _plan(global_batch: int = 4, **kw) -> Plan:
    return Plan(global_batch=global_batch, seq_len=32, precision="fp32", **kw)


# Each layout switches to the next: FSDP, TP+SP, PP (2 and 4 stages, two schedules, an uneven split), CP, then TP
# with ZeRO-1 and full recompute, CP+FSDP in another rank order, kv heads replicated, TP with CP all-to-all (HSDP
# is in the uneven chain, DDP and CP ring with TP in test_runtime_layouts.py and the MoE chain).
DENSE = (
    dict(dp=4, zero=3),
    dict(tp=2, sp=True, dp=2, zero=1),
    dict(pp=2, dp=2, zero=1, schedule="1f1b"),
    dict(pp=4, schedule="gpipe"),
    dict(pp=2, dp=2, zero=1, layer_split=(1, 3), schedule="1f1b"),  # an uneven split, as the planner makes them
    dict(cp=2, dp=2, zero=3),
    dict(dp=2, tp=2, zero=1, recompute="full"),
    dict(dp=2, cp=2, zero=3, rank_order="dp-tp-cp-ep-pp"),
    dict(tp=4, sp=True),  # 2 kv heads on 4 tp ranks
    dict(tp=2, cp=2, cp_kind="a2a", sp=True),
)
MOE = (  # expert parallelism changes: ep 2 -> 4 -> tp2 with experts over tp -> FSDP only -> ep over pp, cp, tp, etp
    dict(dp=4, ep=2, zero=1),
    dict(dp=4, ep=4, zero=3),
    dict(tp=2, sp=True, dp=2, ep=2, zero=1),
    dict(dp=4, zero=3),
    dict(dp=2, ep=2, pp=2),
    dict(dp=2, tp=2, sp=True),
    dict(dp=2, tp=2, ep=4, sp=True),  # ep not inside dp
    dict(dp=2, tp=2, ep=2, zero=3),
    dict(dp=2, tp=2, etp=2, ep=2, sp=True),
    dict(dp=2, cp=2, ep=2, zero=3),
)
GPT = (dict(pp=2, dp=2, zero=3), dict(pp=2, tp=2, sp=True), dict(dp=4, zero=3))  # tied embeddings under pp
MLA_MODEL = {"name": "tiny-mla-q", "n_layers": 4, "hidden": 64, "n_heads": 4, "n_kv_heads": 4, "head_dim": 16,
             "ffn_hidden": 128, "vocab": 256, "attention_kind": "mla", "kv_lora_rank": 16, "qk_rope_head_dim": 8,
             "v_head_dim": 12, "q_lora_rank": 32}
MLA = (dict(dp=2, tp=2, sp=True, zero=3), dict(dp=4, zero=1))
# Uneven batch shares on two pools of 2 GPUs (a mixed cluster's plans, global batch 8): HSDP inside each pool with
# 3 and 1 micro-batches per replica; the world shrinks to 2 ranks (2 idle) under FSDP and TP, grows back to a
# 2-stage pipeline with 5 and 3 micro-batches (two schedules of different lengths), then ZeRO-1 with 1 and 3.
UNEVEN_POOLS = (2, 2)
UNEVEN = (
    dict(dp=4, zero=3, dp_shard=2, batch_shares=(3, 1)),
    dict(dp=2, zero=3),
    dict(tp=2, sp=True),
    dict(pp=2, dp=2, schedule="1f1b", rank_order="tp-cp-ep-pp-dp", batch_shares=(5, 3)),
    dict(dp=4, zero=1, dp_shard=2, batch_shares=(1, 3)),
)
UNEVEN_CHECKED = (0, 2)
"""The uneven chain's switches done through DCP too: the shrink to 2 ranks and the growth back to 4."""


CHECKED = 3
"""Switches per chain also done through a DCP checkpoint and compared bit for bit, 11 in all over the five chains
(the rest check the numbers only, to keep the suite's time)."""


def _chain(tmp: Path, name: str, model: str, layouts: tuple, *, global_batch: int = 4,
           pools: tuple[int, ...] = (), checked: tuple[int, ...] = tuple(range(CHECKED))) -> RunConfig:
    plans = [_plan(global_batch, **kw) for kw in layouts]
    switches = tuple({"step": i + 1, "plan": p.to_dict(), "check": i in checked} for i, p in enumerate(plans[1:]))
    return RunConfig(plan=plans[0], model=model, steps=len(plans), out_dir=str(tmp / name), pools=pools,
                     timeout_s=PG_TIMEOUT_S, switches=switches)


def _lines(cfg: RunConfig) -> list[dict]:
    return [json.loads(x) for x in (Path(cfg.out_dir) / "metrics.jsonl").read_text().splitlines()]


NAMES = ("dense", "moe", "gpt", "mla", "uneven")


@pytest.fixture(scope="module")
def chains(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("switch")
    mla = tmp / "tiny-mla-q.json"
    mla.write_text(json.dumps(MLA_MODEL))
    cfgs = [_chain(tmp, "dense", "tiny-llama", DENSE), _chain(tmp, "moe", "tiny-moe", MOE),
            _chain(tmp, "gpt", "tiny-gpt", GPT), _chain(tmp, "mla", str(mla), MLA),
            _chain(tmp, "uneven", "tiny-llama", UNEVEN, global_batch=8, pools=UNEVEN_POOLS, checked=UNEVEN_CHECKED)]
    check_ok(launch(cfgs, nproc=4, tmp=tmp, timeout=600))
    return cfgs


@pytest.mark.parametrize("which", range(len(NAMES)), ids=NAMES)
def test_every_switch_equals_the_checkpoint_route_and_keeps_the_reference_numbers(chains, which):
    cfg = chains[which]
    lines = _lines(cfg)
    switches = [r for r in lines if "switch" in r]
    assert len(switches) == len(cfg.switches) and all("error" not in s for s in switches), switches
    checked = [s for s in switches if "bit_equal" in s]
    assert len(checked) == sum(bool(s.get("check")) for s in cfg.switches)
    assert all(s["bit_equal"] for s in checked), [(s["from"], s["to"]) for s in checked if not s["bit_equal"]]
    rows = [r for r in lines if "step" in r and "switch" not in r and not r.get("summary")]
    ref = reference_rows(RunConfig(plan=cfg.plan, model=cfg.model, steps=cfg.steps))
    assert len(rows) == cfg.steps
    assert max(abs(r["loss"] - x["loss"]) for r, x in zip(rows, ref)) < TOL, (rows, ref)
    assert max(abs(r["grad_norm"] / x["grad_norm"] - 1) for r, x in zip(rows, ref)) < NORM_RTOL


def test_uneven_batch_shares_train_their_own_rows(chains):
    """Each replica of a batch-shares plan trains share * micro_batch sequences of the global batch (the losses
    above equal the reference only because the replicas' gradients are weighted by those shares)."""
    cfg = chains[NAMES.index("uneven")]
    rows = [r for r in _lines(cfg) if "step" in r and "switch" not in r and not r.get("summary")]
    plans = [cfg.plan] + [p for _, p, _ in cfg.switch_plans()]
    got = [r.get("replica_sequences") for r in rows]
    want = [[s * p.micro_batch for s in replica_shares(p, UNEVEN_POOLS)] if p.batch_shares else None for p in plans]
    assert got == want == [[3, 3, 1, 1], None, None, [5, 3], [1, 1, 3, 3]]


def test_shrink_and_grow_move_state_to_and_from_idle_ranks(chains):
    """Shrinking 4 ranks to 2 leaves ranks 2 and 3 idle with nothing; growing back fills them from ranks 0 and 1:
    the runtime's moved bytes are the transition model's (whose rank map is the same identity), and both are
    bit-equal to the DCP route (checked above)."""
    cfg = chains[NAMES.index("uneven")]
    sw = {(s["from"].get("dp", 1) * s["from"].get("tp", 1) * s["from"].get("pp", 1),
           s["to"].get("dp", 1) * s["to"].get("tp", 1) * s["to"].get("pp", 1)): s
          for s in _lines(cfg) if "switch" in s}
    shrink, grow = sw[(4, 2)], sw[(2, 4)]
    assert shrink["bit_equal"] and grow["bit_equal"]
    for s in (shrink, grow):
        assert s["bytes"] == pytest.approx(s["predicted_bytes"], rel=0.02, abs=4096), s


@pytest.mark.parametrize("which", [0, 1], ids=NAMES[:2])
def test_moved_bytes_are_the_transition_models(chains, which):
    """The runtime's own plan of messages and the analytic geometry agree on the bytes within 2 % (replicated
    norms are the difference: the geometry keeps them whole, the runtime shards them with FSDP). Switches where
    tp exceeds the kv heads are left out: the runtime keeps k and v whole there, the geometry splits them by kv
    head as Megatron-Core does; so are the GPT and MLA chains (learned positions, biased norms and the tied head's
    second copy are not in the geometry)."""
    spec = catalog.model(chains[which].model)
    kv = min(b.layer.attention.n_kv_heads for b in spec.blocks if b.layer.attention)
    for s in (r for r in _lines(chains[which]) if "switch" in r):
        if max(s["from"].get("tp", 1), s["to"].get("tp", 1)) > kv:
            continue
        assert s["bytes"] == pytest.approx(s["predicted_bytes"], rel=0.02, abs=4096), s


def _plan_file(path: Path, model: str = "tiny-llama", **kw) -> Path:
    lines = [f'model = "{model}"', "[plan]", "global_batch = 4", "seq_len = 32", 'precision = "fp32"']
    lines += [f"{k} = {str(v).lower() if isinstance(v, bool) else (repr(v) if isinstance(v, str) else v)}"
              .replace("'", '"') for k, v in kw.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_cli_switch_flags_become_the_run_config(tmp_path):
    """``--switch B.toml@STEP`` (repeatable) with ``--switch-check``: the switches the workers receive (the chains
    above run them)."""
    from meshplan.cli.run import parse_switches

    b = _plan_file(tmp_path / "b.toml", tp=2, sp=True)
    c = _plan_file(tmp_path / "c.toml", dp=2, zero=1)
    got = parse_switches([f"{b}@1", f"{c}@3"], model_ref="tiny-llama", check=True, dry_run=False)
    assert [s["step"] for s in got] == [1, 3] and all(s["check"] and not s["dry_run"] for s in got)
    cfg = RunConfig(plan=_plan(dp=2, zero=3), model="tiny-llama", steps=4, switches=got)
    back = RunConfig.from_json(cfg.to_json())
    assert [(s, p.tp, p.dp) for s, p, _ in back.switch_plans()] == [(1, 2, 1), (3, 1, 2)]


@pytest.mark.parametrize("target, field", [
    ("b.toml@2", "before the last step"),
    ("b.toml", "PLAN.toml@STEP"),
    ("missing.toml@1", "is not a plan file"),
    ("other.toml@1", "is a plan of tiny-moe"),
    ("wide.toml@1", "the world has 2"),
])
def test_bad_switches_are_refused_before_any_process(tmp_path, capsys, target, field):
    from meshplan.cli import main

    a = _plan_file(tmp_path / "a.toml", dp=2, zero=3)
    _plan_file(tmp_path / "b.toml", tp=2)
    _plan_file(tmp_path / "other.toml", model="tiny-moe", dp=2)
    _plan_file(tmp_path / "wide.toml", dp=4)
    assert main(["run", "--plan", str(a), "--switch", str(tmp_path / target), "--steps", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err


def test_elastic_needs_a_checkpoint_folder(tmp_path, capsys):
    from meshplan.cli import main

    a = _plan_file(tmp_path / "a.toml", dp=2, zero=3)
    assert main(["run", "--plan", str(a), "--elastic", "1", "--steps", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--elastic" in err and "--checkpoint-dir" in err


def test_replica_rows_tile_the_global_batch():
    from meshplan.runtime.data import replica_rows

    plan = _plan(8, dp=4, zero=3, dp_shard=2, batch_shares=(3, 1))
    shares = replica_shares(plan, (2, 2))
    assert shares == (3, 3, 1, 1) and replica_shares(_plan(8, dp=4), (4,)) == (2, 2, 2, 2)
    rows = [replica_rows(shares, dp_rank=d, micro_batch=1) for d in range(4)]
    assert [(r.start, r.stop) for r in rows] == [(0, 3), (3, 6), (6, 7), (7, 8)]


def test_uneven_shares_need_the_plan_files_pools(tmp_path, capsys):
    """A plan with batch shares runs on the pools its file names (``gpus``), and is refused without them."""
    from meshplan.cli import main
    from meshplan.cli.run import run_pools

    shares = _plan(8, dp=4, zero=3, dp_shard=2, batch_shares=(3, 1))
    assert run_pools("2xh100-sxm+2xa100", [shares]) == (2, 2) and run_pools("4xh100-sxm", [shares]) == ()
    a = _plan_file(tmp_path / "a.toml", dp=4, zero=3, dp_shard=2, batch_shares=[3, 1])
    a.write_text(a.read_text().replace("global_batch = 4", "global_batch = 8"))
    assert main(["run", "--plan", str(a), "--steps", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "batch_shares" in err and "gpus" in err
