"""``meshplan check``: calibrate the local devices (or take ``--hardware``), enumerate the feasible plans of the
local world, predict each, run each for real, and report how well prediction ranks reality.

torch is imported only inside the command (and the timing runs in torchrun workers).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

import typer

from meshplan.errors import SpecError


def predict(model_ref: str, hardware: str, plans: list, world: int) -> list[float]:
    """Predicted step time (s) of each plan on ``world`` devices of the hardware profile."""
    from meshplan import catalog
    from meshplan.cost.estimate import estimate

    spec, cluster = catalog.model(model_ref), catalog.cluster(f"{world}x{hardware}")
    return [estimate(spec, cluster, p).step_time for p in plans]


STATS = ("min", "median", "cpu_median")
"""How a plan's rounds become one time: fastest round (default: other tenants only add time), median round, or
the median of the slowest rank's CPU time (blind to bubbles and peer waits)."""


def measure(model_ref: str, plans: list, *, world: int, warmup: int, rounds: int, timeout_s: float,
            stat: str = "min") -> list[float]:
    """Measured step time (s) of each plan by ``stat`` (see STATS), all plans timed in one torchrun launch."""
    return measure_all(model_ref, plans, world=world, warmup=warmup, rounds=rounds, timeout_s=timeout_s)[f"{stat}_s"]


def measure_all(model_ref: str, plans: list, *, world: int, warmup: int, rounds: int, timeout_s: float) -> dict:
    """Every round's wall and CPU time of each plan and each STATS figure (``{stat}_s``), from one launch."""
    from meshplan.runtime.config import RunConfig

    with tempfile.TemporaryDirectory(prefix="meshplan-check-") as tmp:
        cfg_path, out_path = Path(tmp) / "configs.json", Path(tmp) / "times.json"
        cfgs = [json.loads(RunConfig(plan=p, model=model_ref, steps=warmup + rounds, timeout_s=120).to_json())
                for p in plans]
        cfg_path.write_text(json.dumps(cfgs))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
               "--monitor-interval=0.2", "-m", "meshplan.runtime.closed_loop", str(cfg_path), str(out_path),
               str(warmup), str(rounds)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise SpecError("check", f"{timeout_s} s", "the timing runs did not finish in time") from None
        if proc.returncode or not out_path.is_file():
            raise SpecError("check", f"exit {proc.returncode}", "timing runs failed: " + proc.stderr[-1500:])
        return json.loads(out_path.read_text())


def score(labels: list[str], pred: list[float], meas: list[float]) -> dict:
    """Per-plan rows plus MAPE, Kendall tau and the regret of the predicted-fastest plan."""
    from meshplan.runtime.closed_loop import kendall_tau, mape_pct, ranks, regret_pct

    rp, rm = ranks(pred), ranks(meas)
    chosen = min(range(len(pred)), key=lambda i: pred[i])
    rows = [{"plan": lab, "predicted_s": p, "measured_s": m, "error_pct": 100.0 * (p - m) / m,
             "predicted_rank": a, "measured_rank": b, "chosen": i == chosen}
            for i, (lab, p, m, a, b) in enumerate(zip(labels, pred, meas, rp, rm))]
    return {"plans": rows, "mape_pct": mape_pct(pred, meas), "kendall_tau": kendall_tau(pred, meas),
            "regret_pct": regret_pct(pred, meas), "chosen": labels[chosen]}


def print_table(result: dict) -> None:
    """The per-plan rows and the three figures, as a rich table."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title="predicted vs measured step time")
    for col in ("plan", "predicted s", "measured s", "error %", "rank pred", "rank meas"):
        t.add_column(col, justify="left" if col == "plan" else "right")
    for r in result["plans"]:
        t.add_row(("* " if r["chosen"] else "  ") + r["plan"], f"{r['predicted_s']:.3f}", f"{r['measured_s']:.3f}",
                  f"{r['error_pct']:+.1f}", str(r["predicted_rank"]), str(r["measured_rank"]))
    c = Console()
    c.print(t)
    c.print(f"{len(result['plans'])} plans   MAPE {result['mape_pct']:.1f} %   Kendall tau "
            f"{result['kendall_tau']:.2f}   regret of the chosen plan (*) {result['regret_pct']:.1f} %")


def run_check(*, model: str, world: int, hardware: str, global_batch: int, seq_len: int, full: bool,
              rounds: tuple[int, int], timeout_s: float, stat: str = "min") -> dict:
    """Enumerate, predict, measure, score. ``rounds`` is (warm-up rounds, measured rounds)."""
    from meshplan import catalog
    from meshplan.runtime.closed_loop import CheckSpace, covering, enumerate_plans, plan_label

    space = CheckSpace(world=world, global_batch=global_batch, seq_len=seq_len)
    plans = enumerate_plans(catalog.model(model), space)
    if not full:
        plans = covering(plans)
    if not plans:
        raise SpecError("check", model, f"no feasible plan for {world} processes")
    pred = predict(model, hardware, plans, world)
    meas = measure(model, plans, world=world, warmup=rounds[0], rounds=rounds[1], timeout_s=timeout_s, stat=stat)
    out = score([plan_label(p) for p in plans], pred, meas)
    out.update(model=model, world=world, hardware=hardware, global_batch=global_batch, seq_len=seq_len, stat=stat)
    return out


def register(app: typer.Typer) -> None:
    """Add the ``check`` command."""

    @app.command("check")
    def check_cmd(
        model: str = typer.Option("small-llama", "--model", help="Catalog model or model file."),
        nproc: int = typer.Option(2, "--nproc", help="Local processes (the world every plan fills)."),
        hardware: Optional[str] = typer.Option(None, "--hardware", help="Hardware profile (TOML); default: "
                                               "calibrate now."),
        global_batch: int = typer.Option(4, "--global-batch", help="Sequences per step."),
        seq_len: int = typer.Option(256, "--seq-len", help="Tokens per sequence."),
        full: bool = typer.Option(False, "--all", help="Run every feasible plan, not the covering subset."),
        warmup: int = typer.Option(1, "--warmup", help="Warm-up rounds (one step of every plan each)."),
        rounds: int = typer.Option(5, "--rounds", help="Measured rounds (interleaved over the plans)."),
        stat: str = typer.Option("min", "--stat", help="min (fastest round: a shared machine only adds time), "
                                 "median, or cpu_median (per-rank CPU time)."),
        timeout: float = typer.Option(900.0, "--timeout", help="Wall-clock limit of the timing runs (s)."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON: plans, mape_pct, kendall_tau, regret_pct."),
    ) -> None:
        """Predict and run every feasible plan of the local world; report error, rank agreement and regret."""
        if nproc < 1 or rounds < 1 or warmup < 0:
            raise SpecError("--nproc/--rounds/--warmup", (nproc, rounds, warmup), "must be positive")
        if stat not in STATS:
            raise SpecError("--stat", stat, f"one of {', '.join(STATS)}")
        with tempfile.TemporaryDirectory(prefix="meshplan-hw-") as tmp:
            hw = hardware
            if hw is None:
                from meshplan.cli.calibrate import calibrate_to

                hw = str(Path(tmp) / "local.toml")
                calibrate_to(hw, nproc=nproc, base="cpu", min_time_s=0.05)
            result = run_check(model=model, world=nproc, hardware=hw, global_batch=global_batch, seq_len=seq_len,
                               full=full, rounds=(warmup, rounds), timeout_s=timeout, stat=stat)
        if as_json:
            from meshplan.cli.common import print_json

            print_json(result)
        else:
            print_table(result)
