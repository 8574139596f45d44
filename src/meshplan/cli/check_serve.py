"""``meshplan check --serve``: serve a sweep of closed-loop cases for real on local processes (the runtime's
decoder with a KV cache, continuous batching and TP), predict each with the serving model on this host's
calibrated profile, and report MAPE, Kendall tau and regret for TTFT and TPOT; every generated token is checked
against a single-process greedy reference without a cache."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from meshplan.errors import SpecError

METRICS = (("ttft", 0), ("tpot", 1))


def measure(cases: list, *, world: int, timeout_s: float) -> list[dict]:
    """Run the cases in one supervised torchrun launch; each case's requests (tokens and times)."""
    from meshplan.runtime.launch import worker_env
    from meshplan.runtime.procs import run_tree

    with tempfile.TemporaryDirectory(prefix="meshplan-serve-check-") as tmp:
        cfg, out = Path(tmp) / "cases.json", Path(tmp) / "out.json"
        cfg.write_text(json.dumps([c.to_dict() for c in cases]))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
               "--monitor-interval=0.2", "-m", "meshplan.runtime.serve_check", str(cfg), str(out)]
        done = run_tree(cmd, timeout_s=timeout_s, env=worker_env(world))
        if done.timed_out:
            raise SpecError("--timeout", timeout_s, f"the serving runs did not finish in {timeout_s:g} s and were "
                            "stopped")
        if done.returncode or not out.is_file():
            raise SpecError("check --serve", f"exit {done.returncode}", "the serving runs failed (output above)")
        return json.loads(out.read_text())


def run_serve_check(*, model: str, nproc: int, hardware: str, timeout_s: float) -> dict:
    """Predict, run and score the default sweep."""
    from meshplan.calibrate.serve_agreement import agreement, default_cases, measured, predict_case

    cases = default_cases(model, nproc)
    pred = [predict_case(c, hardware, nproc) for c in cases]
    results = measure(cases, world=nproc, timeout_s=timeout_s)
    meas = [measured(r["requests"]) for r in results]
    labels = [c.label() for c in cases]
    out = {m: agreement(labels, [p[i] for p in pred], [x[i] for x in meas]) for m, i in METRICS}
    from meshplan.runtime.decode import token_mismatches

    out["token_mismatches"] = token_mismatches(results)
    out.update(model=model, world=nproc, hardware=hardware, n_cases=len(cases))
    return out


def print_serve_table(result: dict) -> None:
    """Per-case predicted and measured TTFT and TPOT, then the figures."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    t = Table(title="serving: predicted vs measured", box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("case", justify="left", ratio=1)
    for col in ("TTFT ms\npred", "meas", "err %", "TPOT ms\npred", "meas", "err %"):
        t.add_column(col, justify="right", no_wrap=True)
    for a, b in zip(result["ttft"]["cases"], result["tpot"]["cases"]):
        t.add_row(a["case"], f"{1e3 * a['predicted_s']:.1f}", f"{1e3 * a['measured_s']:.1f}", f"{a['error_pct']:+.0f}",
                  f"{1e3 * b['predicted_s']:.2f}", f"{1e3 * b['measured_s']:.2f}", f"{b['error_pct']:+.0f}")
    c = Console()
    c.print(t)
    for m, _ in METRICS:
        r = result[m]
        c.print(f"{m.upper()}: MAPE {r['mape_pct']:.1f} %   Kendall tau {r['kendall_tau']:.2f}   regret "
                f"{r['regret_pct']:.1f} %")
    bad = result["token_mismatches"]
    c.print("tokens: every request equals the single-process greedy reference" if not bad else
            f"tokens: {len(bad)} requests differ from the reference, e.g. {bad[0]}")
