"""A rank killed mid-run: the run ends within the process-group timeout, the survivors get a new layout, and the
run resumes from its last checkpoint to the loss of an uninterrupted run."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from runtime_helpers import PG_TIMEOUT_S, TOL

from meshplan.runtime.config import RunConfig
from meshplan.runtime.elastic import killed_ranks
from meshplan.runtime.launch import start_elastic
from meshplan.runtime.train import reference_losses
from meshplan.spec.plan import Plan

pytestmark = pytest.mark.runtime

REPORT = """[1]:
  time      : 2026-12-01_19:06:35
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 26206)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 26206
[2]:
  rank      : 2 (local_rank: 2)
  exitcode  : -15 (pid: 26207)  (SIGTERM)
"""


def test_killed_ranks_are_the_signalled_ones_not_the_torn_down():
    assert killed_ranks(REPORT) == [1]
    assert killed_ranks("") == []


def test_sigkill_then_shrink_resumes_and_finishes(tmp_path, capsys):
    plan = Plan(global_batch=4, seq_len=32, precision="fp32", dp=2, zero=3)
    cfg = RunConfig(plan=plan, model="tiny-llama", steps=6, out_dir=str(tmp_path / "out"), timeout_s=PG_TIMEOUT_S,
                    checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every=2, fail_at_step=4)
    ckpt = Path(cfg.checkpoint_dir)
    (ckpt / "step-00000004.tmp").mkdir(parents=True)  # half-written checkpoints must never be picked up:
    (ckpt / "step-00000004").mkdir()  # neither a temporary folder nor one without its meta.json
    began = time.monotonic()
    rc = start_elastic(cfg, nproc=2, summary="test", restarts=1, timeout_s=400)
    assert rc == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    restart = [r for r in lines if "restart" in r]
    assert len(restart) == 1 and restart[0]["lost_ranks"] == [1] and restart[0]["survivors"] == 1
    assert restart[0]["resume_from_step"] == 2 and restart[0]["gpus_used"] == 1
    # The killed rank ends the attempt in seconds, not at the 120 s process-group timeout.
    assert restart[0]["failed_attempt_s"] < 60
    rows = [json.loads(x) for x in (Path(cfg.out_dir) / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "step" in r and "switch" not in r and not r.get("summary")]
    got = {r["step"]: r["loss"] for r in steps}  # the resumed run rewrites steps 3.. on the new layout
    ref = reference_losses(RunConfig(plan=plan, model="tiny-llama", steps=6))
    assert sorted(got) == [1, 2, 3, 4, 5, 6]
    assert max(abs(got[s] - ref[s - 1]) for s in got) < TOL, (got, ref)
    assert time.monotonic() - began < 300
