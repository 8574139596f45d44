"""Bad input gets one specific line on stderr and a non-zero exit, never a traceback."""

import json

import pytest

from meshplan.cli import main

BASE = ["estimate", "--model", "llama3-8b", "--gpus", "8xh100-sxm", "--global-batch", "16", "--seq-len", "4096"]


@pytest.mark.parametrize("argv, needle", [
    (["estimate", "--model", "llama3-7b", "--gpus", "8xh100-sxm", "--global-batch", "8", "--seq-len", "8"],
     "did you mean: llama3-70b, llama3-8b"),
    (["estimate", "--model", "llama3-8b", "--gpus", "8xh100-sx", "--global-batch", "8", "--seq-len", "8"],
     "unknown gpu"),
    (["estimate", "--model", "llama3-8b", "--gpus", "eightxh100", "--global-batch", "8", "--seq-len", "8"],
     "expected COUNTxGPU"),
    (BASE + ["--tp", "3"], "must divide the 8 GPUs"),
    (BASE + ["--tp", "16", "--dp", "1"], "the cluster has 8"),
    (BASE + ["--tp", "8", "--dp", "1", "--micro-batch", "2", "--global-batch", "7"], "multiple of dp*micro_batch"),
    (BASE + ["--recompute", "some"], "must be one of none, selective, full"),
    (BASE + ["--ep", "2"], "expert parallelism needs a mixture-of-experts model"),
    (["estimate", "--model", "llama3-8b", "--gpus", "8xa100-80gb", "--global-batch", "8", "--seq-len", "8",
      "--precision", "fp8"], "FP8 tensor cores"),
    (["estimate", "--model", "/nonexistent/config.json", "--gpus", "8xh100-sxm", "--global-batch", "8",
      "--seq-len", "8"], "no such file"),
    (["validate", "/nonexistent.csv"], "no such file"),
    (BASE + ["--framework", "megatron-cor"], "did you mean: megatron-core"),
    (BASE + ["--framework", "megatron-deepspeed", "--tp", "2", "--tp-comm-overlap"],
     "megatron-deepspeed cannot overlap TP communication"),
    (BASE + ["--grad-dtype", "fp16"], "framework.grad_dtype = 'fp16': must be one of fp32, bf16"),
    (BASE + ["--framework", "fms-fsdp", "--tp", "2"], "fms-fsdp has no tensor parallelism"),
    (BASE + ["--pp", "2", "--vpp", "2", "--schedule", "zbv"], "megatron-core runs the pipeline schedules 1f1b"),
    (BASE + ["--pp", "2", "--schedule", "zbvv"], "unknown schedule"),
    (["plan", "--model", "llama3-8b", "--gpus", "8xh100-sxm", "--global-batch", "16", "--seq-len", "4096",
      "--framework", "torchtitn"], "did you mean: torchtitan"),
    (["plan", "--model", "llama3-8b", "--gpus", "8xh100-sxm", "--global-batch", "16", "--seq-len", "4096",
      "--framework", "torchtitan", "--tp-comm-overlap"], "torchtitan cannot overlap TP communication"),
])
def test_bad_input_one_line(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err
    assert "Traceback" not in err
    assert err.count("\n") == 1


def test_estimate_json(capsys):
    assert main(BASE + ["--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["plan"]["dp"] == 8
    assert d["step_time_s"] > 0 and d["peak_memory_bytes"] > 0
    assert d["tokens_per_s"] == pytest.approx(16 * 4096 / d["step_time_s"])


def test_unsupported_hf_architecture(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "mamba", "hidden_size": 8}))
    assert main(["estimate", "--model", str(cfg), "--gpus", "8xh100-sxm", "--global-batch", "8",
                 "--seq-len", "8"]) == 2
    assert "unsupported architecture" in capsys.readouterr().err
