"""``meshplan run`` end to end: metrics lines, summary, profiler trace, falling loss on the shipped corpus; bad
plans and bad model files are rejected with their reason before any process group starts."""

from __future__ import annotations

import json
import subprocess

import pytest
from runtime_helpers import meshplan_cli

pytestmark = pytest.mark.runtime

PLAN = """model = "tiny-llama"
[plan]
global_batch = 8
seq_len = 64
dp = {dp}
tp = {tp}
zero = 3
precision = "fp32"
"""


def _meshplan(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return meshplan_cli(*args, timeout=timeout)


def test_run_trains_on_the_corpus_and_writes_metrics_and_a_trace(tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN.format(dp=2, tp=1))
    out = tmp_path / "out"
    proc = _meshplan("run", "--plan", str(plan), "--steps", "12", "--data", "corpus", "--out", str(out),
                     "--profile", "2")
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    steps, summary = rows[:-1], rows[-1]
    assert [r["step"] for r in steps] == list(range(1, 13))
    assert summary["summary"] and summary["steps"] == 12
    assert set(steps[0]) >= {"loss", "step_time_s", "tokens_per_s", "peak_memory_bytes"}
    assert summary["final_loss"] < summary["first_loss"] - 1.5, "the loss must visibly fall"  # 5.56 -> 3.23 here
    assert (out / "trace-step2-rank0.json").stat().st_size > 1000
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 13


def test_plan_not_matching_the_world_is_rejected_before_launch(tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN.format(dp=2, tp=2))
    proc = _meshplan("run", "--plan", str(plan), "--nproc", "2", timeout=60)
    assert proc.returncode == 2
    assert "needs tp*cp*pp*dp = 2*1*1*2 = 4 processes, the world has 2" in proc.stderr
    assert "torch.distributed" not in proc.stderr and "Traceback" not in proc.stderr


def test_plan_not_matching_the_model_is_rejected(tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN.format(dp=1, tp=3))
    proc = _meshplan("run", "--plan", str(plan), timeout=60)
    assert proc.returncode == 2
    assert "tp=3 must divide the 4 attention heads" in proc.stderr


@pytest.mark.parametrize("text, reason", [
    ("{not json", "cannot be parsed"),
    ('{"model_type": "llama", "hidden_size": 64}', "num_attention_heads"),
])
def test_bad_model_file_is_rejected(tmp_path, text, reason):
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN.format(dp=2, tp=1))
    cfg = tmp_path / "config.json"
    cfg.write_text(text)
    proc = _meshplan("run", "--plan", str(plan), "--model", str(cfg), timeout=60)
    assert proc.returncode == 2
    assert reason in proc.stderr and "Traceback" not in proc.stderr


def test_hf_config_json_trains(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4,
                               "num_key_value_heads": 2, "intermediate_size": 64, "num_hidden_layers": 2,
                               "vocab_size": 256}))
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN.format(dp=2, tp=1).replace("seq_len = 64", "seq_len = 16"))
    proc = _meshplan("run", "--plan", str(plan), "--model", str(cfg), "--steps", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1])["steps"] == 2
