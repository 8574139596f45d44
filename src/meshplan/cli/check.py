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


def predict(model_ref: str, hardware: str, plans: list, world: int, stack=None) -> list[float]:
    """Predicted step time (s) of each plan on ``world`` devices of the hardware profile, under ``stack`` (None =
    the profile each plan names)."""
    return [t for t, _ in predict_all(model_ref, hardware, plans, world, stack)]


def predict_all(model_ref: str, hardware: str, plans: list, world: int,
                stack=None) -> list[tuple[float, float]]:
    """(step time s, peak tensor bytes of the busiest rank, allocator reserve excluded) of each plan."""
    from meshplan import catalog
    from meshplan.cost.estimate import estimate

    spec, cluster = catalog.model(model_ref), catalog.cluster(f"{world}x{hardware}")
    out = []
    for p in plans:
        e = estimate(spec, cluster, p, stack=stack)
        out.append((e.step_time, e.memory.total() - e.memory.reserved))
    return out


STATS = ("min", "median", "cpu_median")
"""How a plan's rounds become one time: fastest round (default: other tenants only add time), median round, or
the median of the slowest rank's CPU time (blind to bubbles and peer waits)."""


def measure_all(model_ref: str, plans: list, *, world: int, warmup: int, rounds: int, timeout_s: float,
                device: str = "cpu", stack=None) -> dict:
    """Every round's wall and CPU time of each plan, each STATS figure (``{stat}_s``) and, on a GPU, each plan's
    peak allocated bytes (``peak_bytes``), from one launch (see ``closed_loop.time_plans``)."""
    from meshplan.runtime.config import RunConfig

    with tempfile.TemporaryDirectory(prefix="meshplan-check-") as tmp:
        cfg_path, out_path = Path(tmp) / "configs.json", Path(tmp) / "times.json"
        extra = {"stack": stack} if stack is not None else {}
        cfgs = [json.loads(RunConfig(plan=p, model=model_ref, steps=warmup + rounds, timeout_s=120,
                                     **extra).to_json()) for p in plans]
        cfg_path.write_text(json.dumps(cfgs))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
               "--monitor-interval=0.2", "-m", "meshplan.runtime.closed_loop", str(cfg_path), str(out_path),
               str(warmup), str(rounds)] + (["cuda"] if device == "cuda" else [])
        try:
            # A GPU check's progress goes straight to our stderr; a CPU one stays quiet unless it fails.
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None if device == "cuda" else subprocess.PIPE,
                                  text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise SpecError("check", f"{timeout_s} s", "the timing runs did not finish in time") from None
        if proc.returncode or not out_path.is_file():
            tail = (proc.stderr or "see above")[-1500:]
            raise SpecError("check", f"exit {proc.returncode}", "timing runs failed: " + tail)
        return json.loads(out_path.read_text())


def score(labels: list[str], pred: list[float], meas: list[float]) -> dict:
    """Per-plan rows plus MAPE, Kendall tau and the regret of the predicted-fastest plan."""
    from meshplan.calibrate.agreement import kendall_tau, mape_pct, ranks, regret_pct

    rp, rm = ranks(pred), ranks(meas)
    chosen = min(range(len(pred)), key=lambda i: pred[i])
    rows = [{"plan": lab, "predicted_s": p, "measured_s": m, "error_pct": 100.0 * (p - m) / m,
             "predicted_rank": a, "measured_rank": b, "chosen": i == chosen}
            for i, (lab, p, m, a, b) in enumerate(zip(labels, pred, meas, rp, rm))]
    return {"plans": rows, "mape_pct": mape_pct(pred, meas), "kendall_tau": kendall_tau(pred, meas),
            "regret_pct": regret_pct(pred, meas), "chosen": labels[chosen]}


def add_memory(result: dict, predicted: list[float], measured: list | None) -> None:
    """Per-plan predicted and (on a GPU) measured peak tensor bytes, their error and the worst error."""
    measured = measured or [None] * len(predicted)
    errs = []
    for row, p, m in zip(result["plans"], predicted, measured):
        row["predicted_peak_bytes"], row["measured_peak_bytes"] = p, m
        row["memory_error_pct"] = 100.0 * (p - m) / m if m else None
        if m:
            errs.append(row["memory_error_pct"])
    result["memory_mape_pct"] = sum(abs(e) for e in errs) / len(errs) if errs else None
    result["memory_worst_pct"] = max(errs, key=abs) if errs else None


def print_table(result: dict) -> None:
    """The per-plan rows and the three figures, as a rich table (with peak memory where it was measured)."""
    from rich.console import Console
    from rich.table import Table

    mem = result.get("memory_mape_pct") is not None
    t = Table(title="predicted vs measured step time" + (" and peak memory" if mem else ""))
    cols = ["plan", "predicted s", "measured s", "error %", "rank pred", "rank meas"]
    for col in cols + (["pred GiB", "meas GiB", "mem err %"] if mem else []):
        t.add_column(col, justify="left" if col == "plan" else "right")
    for r in result["plans"]:
        cells = [("* " if r["chosen"] else "  ") + r["plan"], f"{r['predicted_s']:.3f}", f"{r['measured_s']:.3f}",
                 f"{r['error_pct']:+.1f}", str(r["predicted_rank"]), str(r["measured_rank"])]
        if mem:
            cells += [f"{r['predicted_peak_bytes'] / 2**30:.2f}", f"{r['measured_peak_bytes'] / 2**30:.2f}",
                      f"{r['memory_error_pct']:+.1f}"]
        t.add_row(*cells)
    c = Console()
    c.print(t)
    c.print(f"{len(result['plans'])} plans   MAPE {result['mape_pct']:.1f} %   Kendall tau "
            f"{result['kendall_tau']:.2f}   regret of the chosen plan (*) {result['regret_pct']:.1f} %")
    if mem:
        c.print(f"peak memory: mean |error| {result['memory_mape_pct']:.1f} %, worst "
                f"{result['memory_worst_pct']:+.1f} %")


def run_check(*, model: str, space, hardware: str, full: bool, rounds: tuple[int, int], timeout_s: float,
              stat: str = "min", device: str = "cpu") -> dict:
    """Enumerate the plans of ``space`` (a ``CheckSpace``), predict, measure, score. ``rounds`` is (warm-up
    rounds, measured rounds)."""
    from meshplan import catalog
    from meshplan.runtime.closed_loop import covering, enumerate_plans, plan_label

    plans = enumerate_plans(catalog.model(model), space)
    if not full:
        plans = covering(plans)
    if not plans:
        raise SpecError("check", model, f"no feasible plan for {space.world} processes")
    pred = predict_all(model, hardware, plans, space.world, space.stack)
    meas = measure_all(model, plans, world=space.world, warmup=rounds[0], rounds=rounds[1], timeout_s=timeout_s,
                       device=device, stack=space.stack)
    out = score([plan_label(p) for p in plans], [t for t, _ in pred], meas[f"{stat}_s"])
    add_memory(out, [m for _, m in pred], meas.get("peak_bytes"))
    out.update(model=model, world=space.world, hardware=hardware, global_batch=space.global_batch,
               seq_len=space.seq_len, stat=stat, device=device, precision=space.precision)
    return out


def check_space(*, world: int, global_batch: int, seq_len: int, device: str, micro_batches: str):
    """The ``CheckSpace`` of the command's flags: fp32 on a CPU (the single-process reference's precision), bf16
    on GPUs (what the runtime computes in there)."""
    from meshplan.calibrate.agreement import CheckSpace

    if device not in ("cpu", "cuda"):
        raise SpecError("--device", device, "cpu or cuda")
    try:
        mbs = tuple(int(x) for x in micro_batches.split(",") if x.strip())
    except ValueError:
        raise SpecError("--micro-batches", micro_batches, "comma-separated positive integers, e.g. 1,2,4") from None
    if any(m < 1 for m in mbs):
        raise SpecError("--micro-batches", micro_batches, "every size must be >= 1")
    return CheckSpace(world=world, global_batch=global_batch, seq_len=seq_len, micro_batches=mbs,
                      precision="bf16" if device == "cuda" else "fp32")


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
        device: str = typer.Option("cpu", "--device", help="cpu (gloo, fp32) or cuda (one GPU per process, "
                                   "NCCL, bf16; plans run one at a time and their peak memory is measured too)."),
        micro_batches: str = typer.Option("", "--micro-batches", help="Comma-separated micro-batch sizes to try "
                                          "(default: the largest each layout allows, and half)."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON: plans, mape_pct, kendall_tau, regret_pct."),
    ) -> None:
        """Predict and run every feasible plan of the local world; report error, rank agreement and regret."""
        if nproc < 1 or rounds < 1 or warmup < 0:
            raise SpecError("--nproc/--rounds/--warmup", (nproc, rounds, warmup), "must be positive")
        if stat not in STATS:
            raise SpecError("--stat", stat, f"one of {', '.join(STATS)}")
        space = check_space(world=nproc, global_batch=global_batch, seq_len=seq_len, device=device,
                            micro_batches=micro_batches)
        if device == "cuda" and hardware is None:
            raise SpecError("--hardware", None, "a GPU check needs the GPU's profile: a catalog GPU (e.g. h200) or "
                            "a file from `meshplan calibrate --base GPU`")
        with tempfile.TemporaryDirectory(prefix="meshplan-hw-") as tmp:
            hw = hardware
            if hw is None:
                from meshplan.cli.calibrate import calibrate_to

                hw = str(Path(tmp) / "local.toml")
                calibrate_to(hw, nproc=nproc, base="cpu", min_time_s=0.05)
            result = run_check(model=model, space=space, hardware=hw, full=full, rounds=(warmup, rounds),
                               timeout_s=timeout, stat=stat, device=device)
        if as_json:
            from meshplan.cli.common import print_json

            print_json(result)
        else:
            print_table(result)
