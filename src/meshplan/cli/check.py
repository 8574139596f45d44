"""``meshplan check``: calibrate the local devices (or take ``--hardware``), enumerate the feasible plans of the
local world, predict each, run each for real, and report how well prediction ranks reality.

torch is imported only inside the command (and the timing runs in torchrun workers).
"""

from __future__ import annotations

import json
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


TRAINING = {"--global-batch": 4, "--seq-len": 256, "--warmup": 1, "--rounds": 5, "--stat": "min",
            "--micro-batches": ""}
"""The training check's flags and their defaults ("" = the micro-batch sizes each layout allows), in the order
``check_cmd`` unpacks them; ``check --serve`` reads none of them."""

STATS = ("min", "median", "cpu_median")
"""How a plan's rounds become one time: fastest round (default: other tenants only add time), median round, or
the median of the slowest rank's CPU time (blind to bubbles and peer waits)."""


def measure_all(model_ref: str, plans: list, *, world: int, warmup: int, rounds: int, timeout_s: float,
                device: str = "cpu", stack=None) -> dict:
    """Every round's wall and CPU time of each plan, each STATS figure (``{stat}_s``) and, on a GPU, each plan's
    peak allocated bytes (``peak_bytes``), from one launch (see ``closed_loop.time_plans``). The workers run as
    a supervised tree (``runtime.procs``): a stop signal or ``timeout_s`` leaves none behind. Their progress
    goes to our stderr."""
    from meshplan.runtime.config import RunConfig
    from meshplan.runtime.launch import worker_env
    from meshplan.runtime.procs import run_tree

    with tempfile.TemporaryDirectory(prefix="meshplan-check-") as tmp:
        cfg_path, out_path = Path(tmp) / "configs.json", Path(tmp) / "times.json"
        extra = {"stack": stack} if stack is not None else {}
        cfgs = [json.loads(RunConfig(plan=p, model=model_ref, steps=warmup + rounds, timeout_s=120,
                                     **extra).to_json()) for p in plans]
        cfg_path.write_text(json.dumps(cfgs))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
               "--monitor-interval=0.2", "-m", "meshplan.runtime.closed_loop", str(cfg_path), str(out_path),
               str(warmup), str(rounds)] + (["cuda"] if device == "cuda" else [])
        done = run_tree(cmd, timeout_s=timeout_s, env=worker_env(world))
        if done.timed_out:
            raise SpecError("--timeout", timeout_s, f"the timing runs did not finish in {timeout_s:g} s and were "
                            "stopped")
        if done.returncode or not out_path.is_file():
            raise SpecError("check", f"exit {done.returncode}", "the timing runs failed (their output is above)")
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
    """The per-plan rows and the three figures, as a rich table (with peak memory where it was measured), in a
    compact layout that fits an 80-column terminal."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    mem = result.get("memory_mape_pct") is not None
    t = Table(title="predicted vs measured step time" + (" and peak memory" if mem else ""), box=box.SIMPLE_HEAD,
              pad_edge=False)
    t.add_column("plan (* chosen)", justify="left", ratio=1)
    for col in ["pred s", "meas s", "err %", "rank\npred/meas"] + (["pred\nGiB", "meas\nGiB", "mem\nerr %"]
                                                                  if mem else []):
        t.add_column(col, justify="right", no_wrap=True)
    for r in result["plans"]:
        cells = [("* " if r["chosen"] else "  ") + r["plan"], f"{r['predicted_s']:.3f}", f"{r['measured_s']:.3f}",
                 f"{r['error_pct']:+.1f}", f"{r['predicted_rank']}/{r['measured_rank']}"]
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


def select_plans(model: str, space, *, full: bool) -> list:
    """The plans a check runs: every feasible plan of ``space`` (a ``CheckSpace``) with ``full``, else the
    covering subset."""
    from meshplan import catalog
    from meshplan.runtime.closed_loop import covering, enumerate_plans

    plans = enumerate_plans(catalog.model(model), space)
    if not plans:
        raise SpecError("--nproc", space.world, f"no layout of {model} (global batch {space.global_batch}, "
                        f"{space.seq_len} tokens) fills {space.world} processes: use fewer (2, 4 or 8), or a larger "
                        "--global-batch")
    return plans if full else covering(plans)


def run_check(*, model: str, space, hardware: str, full: bool, rounds: tuple[int, int], timeout_s: float,
              stat: str = "min", device: str = "cpu", plans: list | None = None) -> dict:
    """Predict, measure and score ``plans`` (default: ``select_plans``). ``rounds`` is (warm-up rounds,
    measured rounds)."""
    from meshplan.runtime.closed_loop import plan_label

    plans = plans if plans is not None else select_plans(model, space, full=full)
    pred = predict_all(model, hardware, plans, space.world, space.stack)
    meas = measure_all(model, plans, world=space.world, warmup=rounds[0], rounds=rounds[1], timeout_s=timeout_s,
                       device=device, stack=space.stack)
    out = score([plan_label(p) for p in plans], [t for t, _ in pred], meas[f"{stat}_s"])
    add_memory(out, [m for _, m in pred], meas.get("peak_bytes"))
    out.update(model=model, world=space.world, hardware=hardware, global_batch=space.global_batch,
               seq_len=space.seq_len, stat=stat, device=device, precision=space.precision)
    return out


def host_check(model: str, plans: list, space, *, device: str) -> str:
    """Refuse (HostLimit) a check this host cannot hold, before anything starts; returns what it will use. A CPU
    check builds every plan's trainer at once, a GPU check one plan at a time."""
    import dataclasses

    from meshplan import catalog
    from meshplan.runtime.host import preflight, probe_host

    host = probe_host()
    if device == "cuda" and not host.gpus:
        raise SpecError("--device", "cuda", "no CUDA device visible (torch.cuda sees none); use --device cpu")
    if device == "cpu":
        host = dataclasses.replace(host, gpus=0, gpu_free=())  # the timing ranks stay on the CPU
    return preflight(catalog.model(model), plans, space.stack, nproc=space.world, host=host, what="check",
                     together=device == "cpu")


def check_space(*, world: int, global_batch: int, seq_len: int, device: str, micro_batches: str):
    """The ``CheckSpace`` of the command's flags: fp32 on a CPU (the single-process reference's precision), bf16
    on GPUs (what the runtime computes in there)."""
    from meshplan.calibrate.agreement import CheckSpace

    if device not in ("cpu", "cuda"):
        raise SpecError("--device", device, "cpu or cuda")
    try:
        mbs = tuple(int(x) for x in micro_batches.split(",")) if micro_batches else ()
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
        global_batch: Optional[int] = typer.Option(None, "--global-batch", help="Sequences per step (default "
                                                   f"{TRAINING['--global-batch']})."),
        seq_len: Optional[int] = typer.Option(None, "--seq-len", help="Tokens per sequence (default "
                                              f"{TRAINING['--seq-len']})."),
        full: bool = typer.Option(False, "--all", help="Run every feasible plan, not the covering subset."),
        warmup: Optional[int] = typer.Option(None, "--warmup", help="Warm-up rounds (one step of every plan "
                                             f"each; default {TRAINING['--warmup']})."),
        rounds: Optional[int] = typer.Option(None, "--rounds", help="Measured rounds (interleaved over the "
                                             f"plans; default {TRAINING['--rounds']})."),
        stat: Optional[str] = typer.Option(None, "--stat", help="min (fastest round: a shared machine only adds "
                                           "time; the default), median, or cpu_median (per-rank CPU time)."),
        timeout: float = typer.Option(900.0, "--timeout", help="Wall-clock limit of the timing runs (s)."),
        device: str = typer.Option("cpu", "--device", help="cpu (gloo, fp32) or cuda (one GPU per process, "
                                   "NCCL, bf16; plans run one at a time and their peak memory is measured too)."),
        micro_batches: Optional[str] = typer.Option(None, "--micro-batches", help="Comma-separated micro-batch "
                                                    "sizes to try (default: the largest each layout allows, and "
                                                    "half)."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON: plans, mape_pct, kendall_tau, regret_pct."),
        serve: bool = typer.Option(False, "--serve", help="Check the serving model instead: a sweep of closed-loop "
                                   "cases (TP, clients, lengths) served by the runtime's decoder with a KV cache "
                                   "and continuous batching; TTFT and TPOT against the prediction, and every token "
                                   "against a greedy reference."),
    ) -> None:
        """Predict and run every feasible plan of the local world; report error, rank agreement and regret."""
        from meshplan.cli.run import positive

        given = {"--global-batch": global_batch, "--seq-len": seq_len, "--warmup": warmup, "--rounds": rounds,
                 "--stat": stat, "--micro-batches": micro_batches, "--all": True if full else None}
        if nproc < 1:
            raise SpecError("--nproc", nproc, "must be >= 1")
        positive("--timeout", timeout, what="seconds the timing runs may take")
        if serve:
            _training_only(given)
            _serve(model=model, nproc=nproc, hardware=hardware, timeout=timeout, device=device, as_json=as_json)
            return
        global_batch, seq_len, warmup, rounds, stat, micro_batches = _training_args(given)
        space = check_space(world=nproc, global_batch=global_batch, seq_len=seq_len, device=device,
                            micro_batches=micro_batches)
        if device == "cuda" and hardware is None:
            raise SpecError("--hardware", None, "a GPU check needs the GPU's profile: a catalog GPU (e.g. h200) or "
                            "a file from `meshplan calibrate --base GPU`")
        _train(model=model, space=space, hardware=hardware, full=full, rounds=(warmup, rounds), timeout=timeout,
               stat=stat, device=device, as_json=as_json)


def _training_args(given: dict) -> tuple:
    """The training check's settings (global batch, sequence length, warm-up and measured rounds, statistic,
    micro-batch sizes): the flags given over their defaults, each checked."""
    if given["--micro-batches"] is not None and not given["--micro-batches"].strip():
        raise SpecError("--micro-batches", given["--micro-batches"], "comma-separated positive integers, e.g. "
                        "1,2,4 (leave the flag out for the sizes each layout allows)")
    global_batch, seq_len, warmup, rounds, stat, micro_batches = (
        TRAINING[f] if given[f] is None else given[f] for f in TRAINING)
    for flag, value, least in (("--rounds", rounds, 1), ("--warmup", warmup, 0),
                               ("--global-batch", global_batch, 1), ("--seq-len", seq_len, 1)):
        if value < least:
            raise SpecError(flag, value, f"must be >= {least}")
    if stat not in STATS:
        raise SpecError("--stat", stat, f"one of {', '.join(STATS)}")
    return global_batch, seq_len, warmup, rounds, stat, micro_batches


def _train(*, model: str, space, hardware: str | None, full: bool, rounds: tuple[int, int], timeout: float,
           stat: str, device: str, as_json: bool) -> None:
    """The training check: calibrate (unless ``hardware``), then predict, run and score the plans of ``space``."""
    from meshplan import catalog
    from meshplan.cli.run import stops_cleanly
    from meshplan.runtime.host import require_torch
    from meshplan.runtime.launch import progress

    nproc = space.world
    catalog.model(model)  # bad references fail here, before torch and before any process
    if hardware is not None:
        catalog.cluster(f"{nproc}x{hardware}")
    require_torch("meshplan check")
    plans = select_plans(model, space, full=full)
    summary = host_check(model, plans, space, device=device)
    progress(f"check: {len(plans)} plans of {model} on {summary}")
    with stops_cleanly(), tempfile.TemporaryDirectory(prefix="meshplan-hw-") as tmp:
        hw = _host_profile(hardware, nproc=nproc, tmp=tmp, what="check")
        progress(f"check: predicting, then timing {rounds[0]} warm-up and {rounds[1]} measured rounds of every plan")
        result = run_check(model=model, space=space, hardware=hw, full=full, rounds=rounds, timeout_s=timeout,
                           stat=stat, device=device, plans=plans)
    if as_json:
        from meshplan.cli.common import print_json

        print_json(result)
    else:
        print_table(result)


def _host_profile(hardware: str | None, *, nproc: int, tmp: str, what: str) -> str:
    """The hardware profile a check predicts with: ``hardware``, else this host calibrated now into ``tmp``."""
    if hardware is not None:
        return hardware
    from meshplan.cli.calibrate import calibrate_to
    from meshplan.runtime.launch import progress

    progress(f"{what}: calibrating this host ({nproc} processes of micro-benchmarks)")
    hw = str(Path(tmp) / "local.toml")
    calibrate_to(hw, nproc=nproc, base="cpu", min_time_s=0.05)
    return hw


def _training_only(given: dict) -> None:
    """Refuse, with ``--serve``, a flag of the training check (the serving sweep does not read it)."""
    flag = next((f for f, v in given.items() if v is not None), None)
    if flag:
        raise SpecError(flag, given[flag], "is a flag of the training check; check --serve runs its own sweep of "
                        "cases and does not read it (leave it out, or drop --serve)")


def _serve(*, model: str, nproc: int, hardware: str | None, timeout: float, device: str, as_json: bool) -> None:
    """``check --serve``: calibrate (unless --hardware), then predict, serve and score the default sweep."""
    from meshplan import catalog
    from meshplan.calibrate.serve_agreement import check_decodable
    from meshplan.cli.check_serve import print_serve_table, run_serve_check
    from meshplan.cli.run import stops_cleanly
    from meshplan.runtime.host import require_torch
    from meshplan.runtime.launch import progress

    if device != "cpu":
        raise SpecError("--device", device, "check --serve runs on CPU processes (gloo) for now")
    check_decodable(catalog.model(model))
    if hardware is not None:
        catalog.cluster(f"{nproc}x{hardware}")
    require_torch("meshplan check --serve")
    with stops_cleanly(), tempfile.TemporaryDirectory(prefix="meshplan-hw-") as tmp:
        hw = _host_profile(hardware, nproc=nproc, tmp=tmp, what="check --serve")
        progress(f"check --serve: serving the sweep of {model} on {nproc} processes")
        result = run_serve_check(model=model, nproc=nproc, hardware=hw, timeout_s=timeout)
    if as_json:
        from meshplan.cli.common import print_json

        print_json(result)
    else:
        print_serve_table(result)
