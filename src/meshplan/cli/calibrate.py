"""``meshplan calibrate``: measure the local devices with short micro-benchmarks and write a hardware profile
(catalog GPU format plus a ``[calibration]`` table) that ``--gpus 2xhw.toml`` accepts in estimate, plan and run.

The benchmarks run under torchrun (``meshplan.runtime.bench``); torch is never imported in this process.
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


def bench_command(out_json: str, *, nproc: int, min_time_s: float) -> list[str]:
    """The command line that benchmarks ``nproc`` local processes and writes raw timings to ``out_json``."""
    if nproc == 1:
        return [sys.executable, "-m", "meshplan.runtime.bench", out_json, str(min_time_s)]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "--monitor-interval=0.2", "-m", "meshplan.runtime.bench", out_json, str(min_time_s)]


def run_bench(*, nproc: int, min_time_s: float = 0.05, timeout_s: float = 300) -> dict:
    """Raw benchmark timings of ``nproc`` local processes (see ``meshplan.runtime.bench``)."""
    with tempfile.TemporaryDirectory(prefix="meshplan-bench-") as tmp:
        path = Path(tmp) / "bench.json"
        proc = subprocess.run(bench_command(str(path), nproc=nproc, min_time_s=min_time_s), capture_output=True,
                              text=True, timeout=timeout_s)
        if proc.returncode or not path.is_file():
            raise SpecError("calibrate", f"exit {proc.returncode}", "benchmarks failed: " + proc.stderr[-800:])
        return json.loads(path.read_text())


def profile_toml(bench: dict, *, base: str, name: str) -> str:
    """The fitted profile as catalog TOML text."""
    import tomli_w

    from meshplan import catalog
    from meshplan.calibrate.local import fit_profile
    from meshplan.spec.io import gpu_to_dict

    gpu = fit_profile(bench, base=catalog.gpu(base), name=name)
    d = gpu_to_dict(gpu)
    d = {k: v for k, v in d.items() if k not in ("peak_tflops", "calibration")} | \
        {"peak_tflops": d["peak_tflops"], "calibration": d.get("calibration", {})}
    return f"# {name}: {gpu.source}\n" + tomli_w.dumps(d)


def calibrate_to(out: str, *, nproc: int, base: str, min_time_s: float, raw: str | None = None) -> str:
    """Benchmark (or read ``raw`` timings), fit, write ``out``; returns the TOML text."""
    bench = json.loads(Path(raw).read_text()) if raw else run_bench(nproc=nproc, min_time_s=min_time_s)
    text = profile_toml(bench, base=base, name=Path(out).stem)
    Path(out).write_text(text)
    return text


def register(app: typer.Typer) -> None:
    """Add the ``calibrate`` command."""

    @app.command("calibrate")
    def calibrate_cmd(
        out: str = typer.Option(..., "--out", help="Hardware profile to write (TOML)."),
        nproc: int = typer.Option(2, "--nproc", help="Local processes (devices) to benchmark together."),
        base: str = typer.Option("cpu", "--base", help="Catalog GPU to start from (its datasheet peaks stay on "
                                 "a GPU; a CPU's peaks are the measured rates)."),
        min_time: float = typer.Option(0.05, "--min-time", help="Least seconds per measured case."),
        raw: Optional[str] = typer.Option(None, "--raw", help="Fit these raw timings (JSON) instead of "
                                          "benchmarking."),
        save_raw: Optional[str] = typer.Option(None, "--save-raw", help="Also keep the raw timings here."),
    ) -> None:
        """Micro-benchmark GEMMs, attention, memory and collectives; write a profile for --gpus NxFILE."""
        if nproc < 1:
            raise SpecError("--nproc", nproc, "must be >= 1")
        bench = json.loads(Path(raw).read_text()) if raw else run_bench(nproc=nproc, min_time_s=min_time)
        if save_raw:
            Path(save_raw).write_text(json.dumps(bench, indent=1))
        text = profile_toml(bench, base=base, name=Path(out).stem)
        Path(out).write_text(text)
        typer.echo(text.rstrip())
        typer.echo(f"wrote {out}; use it as --gpus {nproc}x{out}")
