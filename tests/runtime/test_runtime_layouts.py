"""Every parallelism trains the same tiny model with exactly the single-process reference's losses (fp32)."""

from __future__ import annotations

import pytest
from runtime_helpers import TOL, check_ok, config, launch, losses

from meshplan.runtime.train import reference_losses

pytestmark = pytest.mark.runtime


def _assert_match(cfgs) -> None:
    refs: dict = {}
    for cfg in cfgs:
        key = (cfg.model, cfg.plan.global_batch, cfg.plan.seq_len, cfg.steps)
        if key not in refs:
            refs[key] = reference_losses(cfg)
        got = losses(cfg)
        assert len(got) == cfg.steps, cfg.extra
        worst = max(abs(a - b) for a, b in zip(got, refs[key]))
        assert worst < TOL, f"{cfg.out_dir}: {got} vs reference {refs[key]}"


def test_two_processes_dp_fsdp_pp_cp(tmp_path):
    sched_csv = tmp_path / "gpipe_like.csv"
    sched_csv.write_text("0F0,0F1,0F2,0F3,0B0,0B1,0B2,0B3\n1F0,1F1,1F2,1F3,1B0,1B1,1B2,1B3\n")
    cfgs = [
        config(tmp_path, "ddp", dp=2),
        config(tmp_path, "fsdp", dp=2, zero=3),
        config(tmp_path, "zero1", dp=2, zero=1),
        config(tmp_path, "zero2_accum", dp=2, zero=2, global_batch=8, micro_batch=2, steps=2),
        config(tmp_path, "cp_ring", cp=2, recompute="selective"),
        config(tmp_path, "gpt_fsdp", model="tiny-gpt", dp=2, zero=3),
        config(tmp_path, "pp_csv", pp=2, schedule=str(sched_csv)),
    ]
    for name in ("gpipe", "1f1b"):
        cfgs.append(config(tmp_path, f"pp_{name}", pp=2, schedule=name, recompute="full"))
    for name in ("interleaved_1f1b", "looped_bfs", "interleaved_zb", "zbv", "dualpipev"):
        cfgs.append(config(tmp_path, f"pp_{name}", pp=2, vpp=2, schedule=name))
    check_ok(launch(cfgs, nproc=2, tmp=tmp_path))
    _assert_match(cfgs)


def test_four_processes_hsdp_tp_cp_ep(tmp_path):
    cfgs = [
        config(tmp_path, "hsdp", dp=4, zero=3, dp_shard=2),
        config(tmp_path, "tp_sp_fsdp", dp=2, tp=2, sp=True, zero=3),
        config(tmp_path, "tp_zero1_recompute", dp=2, tp=2, zero=1, recompute="full"),
        config(tmp_path, "cp_fsdp", dp=2, cp=2, zero=3),
        config(tmp_path, "tp_rank_order", dp=2, tp=2, sp=True, rank_order="dp-tp-cp-ep-pp"),
        config(tmp_path, "ep_fsdp", model="tiny-moe", dp=4, ep=2, zero=3),
        config(tmp_path, "ep_pp", model="tiny-moe", dp=2, ep=2, pp=2),
        config(tmp_path, "moe_tp_sp", model="tiny-moe", dp=2, tp=2, sp=True),
    ]
    check_ok(launch(cfgs, nproc=4, tmp=tmp_path))
    _assert_match(cfgs)


def test_eight_processes_three_d(tmp_path):
    cfgs = [
        config(tmp_path, "pp_fsdp_tp", pp=2, dp=2, zero=3, tp=2, sp=True),
        config(tmp_path, "pp_cp_dp", pp=2, vpp=2, schedule="interleaved_1f1b", dp=2, cp=2, zero=2),
    ]
    check_ok(launch(cfgs, nproc=8, tmp=tmp_path))
    _assert_match(cfgs)
