#!/usr/bin/env bash
# GPU check of the runtime: the same `meshplan run` path as the CPU suite, on one GPU with NCCL and bf16.
# Trains small-llama (dense) and tiny-moe for a few steps, saves and resumes a DCP checkpoint, writes a profiler
# trace, and checks that the loss falls and that peak memory is reported. bf16 on a GPU goes through FSDP2's
# MixedPrecisionPolicy (bf16 params, fp32 reduce) on a size-1 shard mesh, with no autocast; the summary says so.
# Budget: well under 5 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

"$PY" - <<'PY'
import torch, sys
if not torch.cuda.is_available():
    sys.exit("gpu_check: no CUDA device visible to torch")
print("gpu_check:", torch.cuda.get_device_name(0), "torch", torch.__version__, "nccl", torch.cuda.nccl.version())
PY

cat > "$WORK/dense.toml" <<'TOML'
model = "small-llama"
[plan]
global_batch = 16
seq_len = 256
micro_batch = 4
precision = "bf16"
recompute = "selective"
TOML
cat > "$WORK/moe.toml" <<'TOML'
model = "tiny-moe"
[plan]
global_batch = 8
seq_len = 128
precision = "bf16"
recompute = "full"
TOML

run() { timeout 240 "$PY" -m meshplan.cli run --nproc 1 --timeout 60 --wall-timeout 200 "$@"; }

echo "== dense bf16, checkpoint every 10, profile step 5"
run --plan "$WORK/dense.toml" --steps 20 --data corpus --checkpoint-dir "$WORK/ckpt" --checkpoint-every 10 \
    --out "$WORK/dense" --profile 5 | tail -n 3
echo "== resume to step 30"
run --plan "$WORK/dense.toml" --steps 30 --data corpus --checkpoint-dir "$WORK/ckpt" --resume \
    --out "$WORK/resumed" | tail -n 2
echo "== moe bf16 with full recompute"
run --plan "$WORK/moe.toml" --steps 10 --out "$WORK/moe" | tail -n 2

"$PY" - "$WORK" <<'PY'
import json, sys
from pathlib import Path
work = Path(sys.argv[1])
def rows(name):
    return [json.loads(l) for l in (work / name / "metrics.jsonl").read_text().splitlines()]
dense, resumed, moe = rows("dense"), rows("resumed"), rows("moe")
s = dense[-1]
assert s["final_loss"] < s["first_loss"] - 1.0, f"dense loss did not fall: {s}"
assert s["peak_memory_bytes"] and s["peak_memory_bytes"] > 0, "peak memory must be reported on GPU"
for summary in (s, moe[-1]):
    assert summary["compute_dtype"] == "bf16", summary
    assert summary["mixed_precision"].startswith("fsdp2 MixedPrecisionPolicy"), summary
assert resumed[0]["step"] == 21 and resumed[-1]["steps"] == 10, "resume must continue at step 21"
assert resumed[-1]["final_loss"] < s["first_loss"], "resumed loss must stay low"
assert moe[-1]["final_loss"] < moe[-1]["first_loss"], "moe loss did not fall"
assert list(work.glob("dense/trace-step5-rank0.json")), "profiler trace missing"
print(f"gpu_check: OK  dense {s['first_loss']:.3f} -> {s['final_loss']:.3f}, "
      f"{s['tokens_per_s']:.0f} tok/s, peak {s['peak_memory_bytes'] / 2**20:.0f} MiB; "
      f"moe {moe[-1]['first_loss']:.3f} -> {moe[-1]['final_loss']:.3f}")
PY
