"""``meshplan calibrate``: measure the local devices with short micro-benchmarks and write a hardware profile
(catalog GPU format plus a ``[calibration]`` table) that ``--gpus 2xhw.toml`` accepts in estimate, plan and run.

The benchmarks run under torchrun (``meshplan.runtime.bench``); torch is never imported in this process.
"""

from __future__ import annotations

import json
import os
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
    """Raw benchmark timings of ``nproc`` local processes (see ``meshplan.runtime.bench``), run as a supervised
    tree (``runtime.procs``: a stop signal or the timeout leaves no process behind)."""
    from meshplan.runtime.launch import worker_env
    from meshplan.runtime.procs import run_tree

    with tempfile.TemporaryDirectory(prefix="meshplan-bench-") as tmp:
        path = Path(tmp) / "bench.json"
        done = run_tree(bench_command(str(path), nproc=nproc, min_time_s=min_time_s), capture=True,
                        timeout_s=timeout_s, env=worker_env(nproc))
        if done.timed_out:
            raise SpecError("calibrate", f"{timeout_s:g} s", "the benchmarks did not finish in time and were stopped")
        if done.returncode or not path.is_file():
            raise SpecError("calibrate", f"exit {done.returncode}", "benchmarks failed: " + (done.stderr or "")[-800:])
        return json.loads(path.read_text())


def read_raw(path: str) -> dict:
    """Raw timings saved by ``--save-raw`` (SpecError when the file is missing or not such JSON)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError("--raw", path, f"cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
    except json.JSONDecodeError as exc:
        raise SpecError("--raw", path, f"is not JSON ({exc.msg}, line {exc.lineno})") from None
    missing = [k for k in ("gemm", "attention", "copy", "collectives") if not isinstance(data, dict) or k not in data]
    if missing:
        raise SpecError("--raw", path, f"is not a file of raw timings (no {', '.join(missing)}); write one with "
                        "--save-raw")
    return data


def writable_file(flag: str, path: str) -> None:
    """Raise SpecError unless ``path`` can be written as a file (its folder exists and is writable)."""
    p = Path(path)
    if p.is_dir():
        raise SpecError(flag, path, "is a folder; give a file name")
    folder = p.parent
    if not folder.is_dir():
        raise SpecError(flag, path, f"cannot be written: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise SpecError(flag, path, "cannot be written: permission denied")


def _check_host(nproc: int) -> None:
    """Refuse benchmark ranks this host cannot run (the rank bound and visible GPUs of ``runtime.host``)."""
    from meshplan.runtime.host import CPU_RANK_BASE, check_ranks, probe_host

    host = probe_host()
    check_ranks(nproc, host, "calibrate")
    if nproc * CPU_RANK_BASE > host.memory:
        raise SpecError("--nproc", nproc, f"needs ~{nproc * CPU_RANK_BASE / 2**30:.1f} GiB, this host has "
                        f"{host.memory / 2**30:.1f} GiB available")


def profile_toml(bench: dict, *, base: str, name: str, source: str = "the benchmarks") -> str:
    """The fitted profile as catalog TOML text (``source``: where ``bench`` came from, for errors)."""
    import tomli_w

    from meshplan import catalog
    from meshplan.calibrate.local import fit_profile
    from meshplan.spec.io import gpu_to_dict

    try:
        gpu = fit_profile(bench, base=catalog.gpu(base), name=name)
    except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as exc:  # a hand-edited or cut raw file
        raise SpecError("--raw", source, f"is incomplete or malformed ({type(exc).__name__}: {exc}); write one "
                        "with --save-raw") from None
    d = gpu_to_dict(gpu)
    d = {k: v for k, v in d.items() if k not in ("peak_tflops", "calibration")} | \
        {"peak_tflops": d["peak_tflops"], "calibration": d.get("calibration", {})}
    return f"# {name}: {gpu.source}\n" + tomli_w.dumps(d)


def calibrate_to(out: str, *, nproc: int, base: str, min_time_s: float, raw: str | None = None) -> str:
    """Benchmark (or read ``raw`` timings), fit, write ``out``; returns the TOML text."""
    bench = read_raw(raw) if raw else run_bench(nproc=nproc, min_time_s=min_time_s)
    text = profile_toml(bench, base=base, name=Path(out).stem, source=raw or "the benchmarks")
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
        from meshplan import catalog
        from meshplan.cli.run import positive, stops_cleanly
        from meshplan.runtime.launch import progress

        if nproc < 1:
            raise SpecError("--nproc", nproc, "must be >= 1")
        positive("--min-time", min_time, what="seconds per measured case")
        catalog.gpu(base)  # an unknown GPU fails before minutes of benchmarks
        writable_file("--out", out)
        if save_raw:
            writable_file("--save-raw", save_raw)
        if raw:
            bench = read_raw(raw)
        else:
            from meshplan.runtime.host import require_torch

            require_torch("meshplan calibrate")
            _check_host(nproc)
            progress(f"calibrate: benchmarking GEMMs, attention, memory and collectives on {nproc} processes")
            with stops_cleanly():
                bench = run_bench(nproc=nproc, min_time_s=min_time)
        if save_raw:
            Path(save_raw).write_text(json.dumps(bench, indent=1))
        text = profile_toml(bench, base=base, name=Path(out).stem, source=raw or "the benchmarks")
        Path(out).write_text(text)
        typer.echo(text.rstrip())
        typer.echo(f"wrote {out}; use it as --gpus {nproc}x{out}")
