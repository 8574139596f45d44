"""Memory agreement at full size: ``meshplan memcheck`` (the real runtime on fake tensors) against the cost model
for the layouts of issue 6, on 8 H100s (bf16, seq 8192, micro-batch 1, global batch 8).

    .venv/bin/python benchmarks/bench_memcheck.py [--only fsdp,tp8]

Each layout runs in its own process (the fake process group is process-global); a few minutes in all on two
cores. Prints measured and predicted peak per GPU (the 1 GiB reserve added to both) and their ratio, and whether
any layout is predicted to fit while its measured peak exceeds the capacity.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

GiB = 2**30
FSDP = ["--dp", "8", "--zero", "3"]
PP = ["--pp", "4", "--dp", "2", "--schedule", "1f1b"]
MOE = ["--model", "qwen3-30b-a3b", "--ep", "8", "--dp", "8", "--zero", "3"]
LAYOUTS = {
    "fsdp": ("FSDP (dp 8, zero 3)", FSDP),
    "fsdp-selective": ("FSDP, selective recompute", FSDP + ["--recompute", "selective"]),
    "fsdp-full": ("FSDP, full recompute", FSDP + ["--recompute", "full"]),
    "tp8": ("TP 8 + SP", ["--tp", "8", "--sp", "--dp", "1"]),
    "pp4-z3": ("PP 4 x dp 2, zero 3, 1F1B", PP + ["--zero", "3"]),
    "pp4-z1": ("PP 4 x dp 2, zero 1, 1F1B", PP + ["--zero", "1"]),
    "moe": ("Qwen3-30B-A3B, EP 8 x dp 8, zero 3", MOE),
    "moe-full": ("Qwen3-30B-A3B, EP 8, full recompute", MOE + ["--recompute", "full"]),
}


def run(args: list[str]) -> dict:
    """One memcheck in its own process."""
    cmd = [sys.executable, "-m", "meshplan.cli", "memcheck", "--json", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help=f"Comma-separated subset of {', '.join(LAYOUTS)}.")
    keys = [k for k in ap.parse_args().only.split(",") if k] or list(LAYOUTS)
    print("| layout | measured GiB | predicted GiB | predicted / measured |")
    print("|---|---:|---:|---:|")
    worst, wrong = 0.0, []
    for key in keys:
        title, args = LAYOUTS[key]
        out = run(args)
        ranks = out["ranks"]
        meas = " / ".join(f"{r['peak_measured'] / GiB:.1f}" for r in ranks)
        pred = " / ".join(f"{r['peak_predicted'] / GiB:.1f}" for r in ranks)
        ratio = " / ".join(f"{r['peak_predicted'] / r['peak_measured']:.3f}" for r in ranks)
        where = ", first / last stage" if len(ranks) > 1 else ""
        print(f"| {title}{where} | {meas} | {pred} | {ratio} |", flush=True)
        worst = max([worst] + [abs(r["peak_predicted"] / r["peak_measured"] - 1) for r in ranks])
        wrong += [f"{title} rank {r['rank']}" for r in ranks if r["fits_predicted"] and not r["fits_measured"]]
    print(f"\nlargest error {100 * worst:.1f} %; predicted to fit but measured over capacity: "
          f"{', '.join(wrong) or 'none'}")


if __name__ == "__main__":
    main()
