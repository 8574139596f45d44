#!/usr/bin/env bash
# The closed loop on one GPU, in one short session (~4-6 minutes on an H100/H200):
#   1. `meshplan check --device cuda`: Llama-3.2-1B, every recompute mode x micro-batch 1/2/4/8 on one GPU,
#      bf16 through FSDP2's mixed precision; each plan alone on the device, its step time (fastest of 3 after 2
#      warm-ups) and its peak allocated memory against the prediction from the *catalog* profile (constants
#      fitted on published runs, nothing from this machine).
#   2. scripts/gpu_check.sh: the runtime's NCCL/bf16 path, checkpoint and resume, MoE, profiler.
#   3. `meshplan calibrate --base GPU`: the GPU-sized micro-benchmarks (raw timings kept, so the prediction can be
#      redone offline with the local profile: scripts/rescore_check.py).
# Usage: scripts/gpu_closed_loop.sh OUT_DIR [GPU_KEY]   (GPU_KEY: catalog entry of the device, default h200)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:?usage: gpu_closed_loop.sh OUT_DIR [GPU_KEY]}"
GPU="${2:-h200}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
status=0

"$PY" - <<'PY' 2>&1 | tee "$OUT/env.txt"
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name(0),
      "memory GiB", round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1))
PY
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv >>"$OUT/env.txt" 2>&1

echo "== 1. check: llama3.2-1b on one $GPU"
timeout 270 "$PY" -m meshplan.cli check --device cuda --nproc 1 --hardware "$GPU" --model llama3.2-1b --all \
    --global-batch 8 --seq-len 2048 --micro-batches 1,2,4,8 --warmup 2 --rounds 3 --timeout 260 --json \
    >"$OUT/check.json" 2>"$OUT/check.err" || { status=1; tail -n 30 "$OUT/check.err"; }
"$PY" - "$OUT/check.json" <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["plans"]:
    print(f"{r['plan']:<22} pred {r['predicted_s']:.3f} s meas {r['measured_s']:.3f} s ({r['error_pct']:+.1f} %)  "
          f"peak pred {r['predicted_peak_bytes'] / 2**30:.2f} meas {r['measured_peak_bytes'] / 2**30:.2f} GiB "
          f"({r['memory_error_pct']:+.1f} %)")
print(f"MAPE {d['mape_pct']:.1f} %  tau {d['kendall_tau']:.2f}  regret {d['regret_pct']:.1f} %  "
      f"memory mean |err| {d['memory_mape_pct']:.1f} %, worst {d['memory_worst_pct']:+.1f} %")
PY

echo "== 2. runtime gpu_check"
PYTHON="$PY" timeout 180 bash scripts/gpu_check.sh >"$OUT/gpu_check.log" 2>&1 || status=1
tail -n 15 "$OUT/gpu_check.log"
echo "== 3. calibrate --base $GPU"
timeout 100 "$PY" -m meshplan.cli calibrate --nproc 1 --base "$GPU" --out "$OUT/$GPU-local.toml" \
    --save-raw "$OUT/bench-$GPU.json" >"$OUT/calibrate.log" 2>&1 || { status=1; tail -n 20 "$OUT/calibrate.log"; }
grep -A12 "^\[calibration\]" "$OUT/$GPU-local.toml" || true

exit $status
