"""Checkpoints: saved under one plan, loaded under others (other degrees and world size); a SIGKILLed run resumes
from its last complete checkpoint and ends with the loss of an uninterrupted run."""

from __future__ import annotations

import shutil
import time

import pytest
from runtime_helpers import TOL, check_ok, config, launch, losses

from meshplan.runtime.checkpoint import latest
from meshplan.runtime.train import reference_losses

pytestmark = pytest.mark.runtime


def test_checkpoint_loads_under_two_other_plans(tmp_path):
    ckpt = tmp_path / "ckpt"
    save = config(tmp_path, "save", dp=2, tp=2, sp=True, zero=3, steps=2, checkpoint_dir=str(ckpt))
    check_ok(launch([save], nproc=4, tmp=tmp_path))
    assert latest(str(ckpt))[0] == 2
    other = tmp_path / "ckpt_copy"
    shutil.copytree(ckpt, other)
    as_pp = config(tmp_path, "as_pp", pp=2, schedule="1f1b", steps=4, checkpoint_dir=str(ckpt), resume=True)
    as_fsdp = config(tmp_path, "as_fsdp", dp=2, zero=3, steps=4, checkpoint_dir=str(other), resume=True)
    check_ok(launch([as_pp, as_fsdp], nproc=2, tmp=tmp_path))
    ref = reference_losses(config(tmp_path, "ref", steps=4))
    assert max(abs(a - b) for a, b in zip(losses(save), ref[:2])) < TOL
    for cfg in (as_pp, as_fsdp):
        got = losses(cfg)
        assert len(got) == 2, "resumed runs continue at step 3"
        assert max(abs(a - b) for a, b in zip(got, ref[2:])) < TOL, (cfg.out_dir, got, ref)


def test_sigkilled_run_resumes_to_the_same_loss(tmp_path):
    ckpt = tmp_path / "ckpt"
    doomed = config(tmp_path, "doomed", dp=2, zero=3, steps=5, checkpoint_dir=str(ckpt), checkpoint_every=2,
                    fail_at_step=4)
    began = time.monotonic()
    proc = launch([doomed], nproc=2, tmp=tmp_path, timeout=120)
    assert proc.returncode != 0
    assert time.monotonic() - began < 60, "a killed rank must end the run in seconds, not at a collective timeout"
    assert latest(str(ckpt))[0] == 2
    (ckpt / "step-00000004.tmp").mkdir()  # a half-written checkpoint must never be picked up
    resumed = config(tmp_path, "resumed", dp=2, zero=3, steps=5, checkpoint_dir=str(ckpt), checkpoint_every=2,
                     resume=True)
    whole = config(tmp_path, "whole", dp=2, zero=3, steps=5)
    check_ok(launch([resumed, whole], nproc=2, tmp=tmp_path))
    got = losses(resumed)
    assert len(got) == 3
    assert got == losses(whole)[2:], "bit-identical continuation"
    assert abs(got[-1] - reference_losses(whole)[-1]) < TOL


def test_expert_parallel_checkpoint_reshards_to_another_ep_degree(tmp_path):
    ckpt = tmp_path / "ckpt"
    save = config(tmp_path, "save", model="tiny-moe", dp=4, ep=4, zero=3, steps=2, checkpoint_dir=str(ckpt))
    check_ok(launch([save], nproc=4, tmp=tmp_path))
    load = config(tmp_path, "load", model="tiny-moe", dp=2, ep=2, zero=3, steps=4, checkpoint_dir=str(ckpt),
                  resume=True)
    check_ok(launch([load], nproc=2, tmp=tmp_path))
    ref = reference_losses(config(tmp_path, "ref", model="tiny-moe", steps=4))
    assert max(abs(a - b) for a, b in zip(losses(save) + losses(load), ref)) < TOL
