"""Checkpoints: saved under one plan, loaded under others (other degrees, world size and expert-parallel degree),
continuing with the single-process reference's losses. (A SIGKILLed run resuming from its last complete checkpoint
is test_runtime_elastic.py's; the live-switch chains compare DCP loads under 27 other layouts bit for bit.)"""

from __future__ import annotations

import shutil

import pytest
from runtime_helpers import TOL, check_ok, config, launch, losses

from meshplan.runtime.checkpoint import latest
from meshplan.runtime.train import reference_losses

pytestmark = pytest.mark.runtime


def test_checkpoints_load_under_other_plans_world_sizes_and_expert_degrees(tmp_path):
    """Saved on 4 ranks (TP+SP with FSDP; MoE with ep 4), loaded on 2 (a pipeline, FSDP; ep 2): one launch each
    way."""
    ckpt, moe_ckpt = tmp_path / "ckpt", tmp_path / "moe_ckpt"
    save = config(tmp_path, "save", dp=2, tp=2, sp=True, zero=3, steps=2, checkpoint_dir=str(ckpt))
    save_moe = config(tmp_path, "save_moe", model="tiny-moe", dp=4, ep=4, zero=3, steps=2,
                      checkpoint_dir=str(moe_ckpt))
    check_ok(launch([save, save_moe], nproc=4, tmp=tmp_path))
    assert latest(str(ckpt))[0] == 2 and latest(str(moe_ckpt))[0] == 2
    other = tmp_path / "ckpt_copy"
    shutil.copytree(ckpt, other)
    as_pp = config(tmp_path, "as_pp", pp=2, schedule="1f1b", steps=4, checkpoint_dir=str(ckpt), resume=True)
    as_fsdp = config(tmp_path, "as_fsdp", dp=2, zero=3, steps=4, checkpoint_dir=str(other), resume=True)
    load_moe = config(tmp_path, "load_moe", model="tiny-moe", dp=2, ep=2, zero=3, steps=4,
                      checkpoint_dir=str(moe_ckpt), resume=True)
    check_ok(launch([as_pp, as_fsdp, load_moe], nproc=2, tmp=tmp_path))
    ref = reference_losses(config(tmp_path, "ref", steps=4))
    assert max(abs(a - b) for a, b in zip(losses(save), ref[:2])) < TOL
    for cfg in (as_pp, as_fsdp):
        got = losses(cfg)
        assert len(got) == 2, "resumed runs continue at step 3"
        assert max(abs(a - b) for a, b in zip(got, ref[2:])) < TOL, (cfg.out_dir, got, ref)
    ref_moe = reference_losses(config(tmp_path, "ref", model="tiny-moe", steps=4))
    assert max(abs(a - b) for a, b in zip(losses(save_moe) + losses(load_moe), ref_moe)) < TOL
