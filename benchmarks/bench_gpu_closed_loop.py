"""The GPU closed loop, re-scored: measurements recorded on a GPU by ``scripts/gpu_closed_loop.sh`` (step time
and peak allocated memory of every plan, ``benchmarks/results/*-check.json``) against the cost model's
predictions now, from the catalog profile (constants fitted on published runs only) and from the profile that
``meshplan calibrate`` measured on the same GPU (``benchmarks/results/*-local.toml``).

    .venv/bin/python benchmarks/bench_gpu_closed_loop.py [RESULTS.json] [--local PROFILE.toml]

No GPU needed: the measurements are data, the predictions are recomputed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HERE = Path(__file__).parent / "results"


def recorded_plans(results: dict) -> tuple[str, list, list[float], list[float]]:
    """(model, plans, measured step times, measured peak bytes) of a recorded GPU check."""
    from meshplan.spec.plan import Plan

    run = results["as_run"]
    plans = [Plan(global_batch=run["global_batch"], seq_len=run["seq_len"], micro_batch=m["micro_batch"],
                  recompute=m["recompute"], precision=run["precision"], framework="meshplan")
             for m in results["measured"]]
    return (run["model"], plans, [m["step_time_s"] for m in results["measured"]],
            [m["peak_bytes"] for m in results["measured"]])


def rescore(results: dict, hardware: str) -> dict:
    """``meshplan check``'s scoring of the recorded measurements against predictions on ``hardware``."""
    from meshplan import catalog
    from meshplan.cli.check import add_memory, predict_all, score

    model, plans, times, peaks = recorded_plans(results)
    # The recorded run stepped AdamW per tensor (foreach=False), as the runtime did then.
    pred = predict_all(model, hardware, plans, 1, catalog.framework("meshplan").with_(fused_optimizer=False))
    out = score([m["plan"] for m in results["measured"]], [t for t, _ in pred], times)
    add_memory(out, [m for _, m in pred], peaks)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="?", default=str(HERE / "h200-llama3.2-1b-check.json"))
    ap.add_argument("--catalog", default="h200")
    ap.add_argument("--local", default=str(HERE / "h200-local.toml"))
    args = ap.parse_args()
    results = json.loads(Path(args.results).read_text())
    print(results["what"])
    for label, hw in (("catalog", args.catalog), ("calibrated", args.local)):
        s = rescore(results, hw)
        print(f"\n{label} profile ({Path(hw).name}):")
        for r in s["plans"]:
            print(f"  {r['plan']:<18} step {r['predicted_s']:.3f} vs {r['measured_s']:.3f} s ({r['error_pct']:+6.1f} %)"
                  f"   peak {r['predicted_peak_bytes'] / 2**30:6.2f} vs {r['measured_peak_bytes'] / 2**30:6.2f} GiB "
                  f"({r['memory_error_pct']:+5.1f} %)")
        print(f"  step time: MAPE {s['mape_pct']:.1f} %, Kendall tau {s['kendall_tau']:.2f}, regret "
              f"{s['regret_pct']:.1f} %;  peak memory: mean |error| {s['memory_mape_pct']:.1f} %, worst "
              f"{s['memory_worst_pct']:+.1f} %")


if __name__ == "__main__":
    main()
