"""``run``, ``check``, ``memcheck`` and ``calibrate`` never endanger the machine (issue 13): a plan this host
cannot hold is refused before any process starts; SIGTERM, SIGINT, SIGKILL and the wall timeout leave no process
and no temporary folder behind; a missing torch and bad flags end in one line and exit 2; tables fit 80
columns."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from meshplan import catalog  # noqa: E402
from meshplan.cli import main  # noqa: E402
from meshplan.runtime import host as hostmod  # noqa: E402
from meshplan.runtime.host import GiB, Host, HostLimit, preflight, stage_params  # noqa: E402
from meshplan.runtime.procs import descendants, run_tree  # noqa: E402
from meshplan.spec.plan import Plan  # noqa: E402

TINY = """model = "tiny-llama"
[plan]
global_batch = 8
seq_len = 64
dp = 2
zero = 3
precision = "fp32"
framework = "meshplan"
"""

BIG = """model = "llama3-70b"
gpus = "64xh100-sxm"
[plan]
global_batch = 128
seq_len = 8192
tp = 8
pp = 4
dp = 2
zero = 1
precision = "bf16"
schedule = "1f1b"
"""
STACK = catalog.framework("meshplan")


# ------------------------------------------------------------------------------------------------ pre-flight
def test_stage_params_count_what_the_runtime_builds():
    from meshplan.runtime.models.decoder import build_decoder

    spec = catalog.model("tiny-llama")
    # One layer: q, k, v, o = 64 x (4 + 2 x 2) x 16 + 4 x 16 x 64 = 12,288; SwiGLU 3 x 64 x 128 = 24,576; two
    # norms 2 x 2 x 64 = 256 (layer_params counts 2 h per norm, a LayerNorm's weight and bias; an RMSNorm has h);
    # embedding and head 256 x 64 each.
    layer = 12_288 + 24_576 + 256
    assert stage_params(spec, Plan(global_batch=8, seq_len=64)) == [4 * layer + 2 * 16_384]
    assert stage_params(spec, Plan(global_batch=8, seq_len=64, pp=2, dp=1)) == [2 * layer + 16_384] * 2
    built = sum(p.numel() for p in build_decoder(spec).parameters())
    assert built == pytest.approx(4 * layer + 2 * 16_384, abs=4 * 2 * 64)  # norms: one weight each


def test_memory_refusal_names_both_numbers():
    plan = Plan(global_batch=8, seq_len=64, dp=2, zero=3, precision="fp32")
    small = Host(cores=2, memory=0.5 * GiB, gpus=0)
    with pytest.raises(HostLimit, match=r"needs ~1\.2 GiB of host memory \(2 ranks x 0\.4\d GiB.*this host has "
                                        r"0\.5 GiB available"):
        preflight(catalog.model("tiny-llama"), [plan], STACK, nproc=2, host=small)
    line = preflight(catalog.model("tiny-llama"), [plan], STACK, nproc=2, host=Host(cores=2, memory=8 * GiB, gpus=0))
    assert line.startswith("2 ranks on cpu: ~1.2 GiB of 8.0 GiB")


def test_rank_bound_allows_the_suites_oversubscription_only():
    spec, roomy = catalog.model("tiny-llama"), Host(cores=2, memory=1e15, gpus=0)
    eight = Plan(global_batch=8, seq_len=64, dp=8, zero=3, precision="fp32")
    preflight(spec, [eight], STACK, nproc=8, host=roomy)  # 8 ranks on 2 cores: the runtime suite's layouts
    sixteen = Plan(global_batch=16, seq_len=64, dp=16, zero=3, precision="fp32")
    with pytest.raises(HostLimit, match="16 CPU ranks on 2 usable cores; this host runs at most 8"):
        preflight(spec, [sixteen], STACK, nproc=16, host=roomy)
    preflight(spec, [sixteen], STACK, nproc=16, host=Host(cores=4, memory=1e15, gpus=0))  # 4 per core


def test_gpu_hosts_get_one_rank_per_gpu_and_the_predicted_peak():
    spec = catalog.model("llama3.1-8b")
    plan = Plan(global_batch=8, seq_len=8192, dp=2, zero=3, precision="bf16")
    with pytest.raises(HostLimit, match="2 ranks need 2 GPUs \\(one each\\), this host has 1 visible"):
        preflight(spec, [plan], STACK, nproc=2, host=Host(cores=16, memory=1e12, gpus=1))
    with pytest.raises(HostLimit, match=r"needs ~\d+\.\d GiB per GPU .* has 10\.0 GiB free"):
        preflight(spec, [plan], STACK, nproc=2, host=Host(cores=16, memory=1e12, gpus=2, gpu_free=(10 * GiB,) * 2))
    line = preflight(spec, [plan], STACK, nproc=2, host=Host(cores=16, memory=1e12, gpus=2,
                                                               gpu_free=(140 * GiB,) * 2))
    assert "GiB per GPU of 140.0 free" in line


def test_big_plan_is_refused_before_any_process_starts(tmp_path, monkeypatch, capsys):
    plan = tmp_path / "big.toml"
    plan.write_text(BIG)
    spawned = []
    real = subprocess.Popen

    def popen(args, *a, **k):
        spawned.append(args)
        return real(args, *a, **k)

    monkeypatch.setattr(subprocess, "Popen", popen)
    monkeypatch.setattr(hostmod, "available_memory", lambda: 64 * GiB)  # any host short of ~15 TB
    assert main(["run", "--plan", str(plan)]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    assert re.search(r"needs ~1\d,\d{3}\.\d GiB of host memory \(64 ranks x 2\d\d\.\d\d GiB", errors[0]), errors[0]
    assert "this host has 64.0 GiB available" in errors[0]
    assert "this host has no visible GPU" in err or hostmod.visible_gpus()
    assert not any("torch.distributed.run" in " ".join(map(str, a)) for a in spawned), spawned


MID = """name = "mid-llama"
family = "llama"
n_layers = 4
hidden = 1024
n_heads = 8
n_kv_heads = 4
ffn_hidden = 2816
vocab = 32000
activation = "swiglu"
norm = "rmsnorm"
position = "rope"
"""


def _peak_rss(marker: str, stop: threading.Event, out: dict) -> None:
    while not stop.is_set():
        for pid in descendants(os.getpid()):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
                if marker not in argv or "torch.distributed.run" in argv:
                    continue  # torchrun names the module too
                hwm = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                           if line.startswith("VmHWM"))
                out[pid] = max(out.get(pid, 0), int(hwm.split()[1]) * 1024)
            except (OSError, StopIteration):
                pass
        time.sleep(0.05)


@pytest.mark.runtime
def test_host_memory_estimate_is_never_below_what_the_ranks_take(tmp_path):
    from meshplan.runtime.config import RunConfig
    from meshplan.runtime.host import rank_host_bytes
    from meshplan.runtime.launch import torchrun_command, worker_env

    (tmp_path / "mid.toml").write_text(MID)
    model = str(tmp_path / "mid.toml")
    plan = Plan(global_batch=4, seq_len=256, micro_batch=2, dp=2, zero=3, precision="fp32", framework="meshplan")
    cfg = RunConfig(plan=plan, model=model, steps=2, timeout_s=120)
    (tmp_path / "cfg.json").write_text(cfg.to_json())
    peaks: dict = {}
    stop = threading.Event()
    poller = threading.Thread(target=_peak_rss, args=("meshplan.runtime.worker", stop, peaks))
    poller.start()
    try:
        done = run_tree(torchrun_command(str(tmp_path / "cfg.json"), 2), timeout_s=300, capture=True,
                        env=worker_env(2))
    finally:
        stop.set()
        poller.join()
    assert done.returncode == 0, (done.stderr or "")[-3000:]
    measured, predicted = max(peaks.values()), rank_host_bytes(catalog.model(model), plan, STACK)
    # 112 M parameters, 0.42 GiB whole in fp32: measured 2.19 GiB, estimated 2.38 (HEADROOM 1.1 included).
    assert len(peaks) == 2 and measured <= predicted <= 1.6 * measured, (measured / GiB, predicted / GiB)


# ------------------------------------------------------------------------------------------- process tree
def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _workers(root: int, marker: str) -> list[int]:
    """Descendants running ``marker`` as their own module (``-m marker``), not torchrun whose arguments name it."""
    out = []
    for pid in descendants(root):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
        except OSError:
            continue
        if marker in argv and "torch.distributed.run" not in argv and "meshplan.runtime.procs" not in argv:
            out.append(pid)
    return out


@pytest.fixture
def started():
    """The meshplan processes a test starts; any still running when it ends (a failed assertion before its
    signal) is stopped with SIGTERM, as a scheduler would, and its tree killed, so no test leaves a run behind."""
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            tree = descendants(proc.pid)
            proc.terminate()
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            for pid in tree:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass


def _start(args: list[str], tmp: Path, started: list | None = None) -> subprocess.Popen:
    """meshplan in its own session (our signals reach only it), with a private TMPDIR to look into after;
    registered in ``started`` to be stopped if the test fails before it ends."""
    (tmp / "t").mkdir()
    env = {**os.environ, "TMPDIR": str(tmp / "t")}
    proc = subprocess.Popen([sys.executable, "-m", "meshplan.cli", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True, cwd=tmp)
    if started is not None:
        started.append(proc)
    return proc


def _wait_for_workers(proc: subprocess.Popen, marker: str, n: int = 2, within: float = 180) -> list[int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and proc.poll() is None:
        if len(_workers(proc.pid, marker)) >= n:
            return descendants(proc.pid)
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"no {n} {marker} processes within {within} s: {proc.communicate()[1][-2000:]}")


def _left_behind(tmp: Path) -> list[str]:
    """meshplan's and torchrun's temporary folders in ``tmp`` (torch's own caches, e.g. torchinductor_USER, are
    meant to stay)."""
    return [p.name for p in tmp.iterdir() if p.name.startswith(("meshplan-", "torchelastic_"))]


def _all_gone(pids: list[int], within: float = 15) -> list[int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


@pytest.mark.runtime
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stop_signal_to_run_leaves_no_process_and_one_line(tmp_path, sig, code, started):
    (tmp_path / "plan.toml").write_text(TINY)
    proc = _start(["run", "--plan", "plan.toml", "--steps", "100000"], tmp_path, started)
    tree = _wait_for_workers(proc, "meshplan.runtime.worker")
    assert len(tree) >= 3  # torchrun and two ranks
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err[-3000:]
    assert _all_gone(tree) == []
    said = [line for line in err.splitlines() if "interrupted" in line]
    assert len(said) == 1 and re.fullmatch(f"interrupted by {sig.name}; stopped \\d+ processes", said[0]), err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert _left_behind(tmp_path / "t") == []  # config folder, torchrun's TMPDIR and its logs: removed


@pytest.mark.runtime
def test_sigkill_of_meshplan_still_takes_torchrun_and_its_ranks(tmp_path, started):
    (tmp_path / "plan.toml").write_text(TINY)
    proc = _start(["run", "--plan", "plan.toml", "--steps", "100000"], tmp_path, started)
    tree = _wait_for_workers(proc, "meshplan.runtime.worker")
    proc.kill()  # no handler runs: the death signals torchrun and each rank armed do the work
    proc.communicate(timeout=30)
    assert _all_gone(tree) == []


@pytest.mark.runtime
def test_wall_timeout_stops_the_whole_run_during_start_up(tmp_path, started):
    (tmp_path / "plan.toml").write_text(TINY)
    proc = _start(["run", "--plan", "plan.toml", "--steps", "100000", "--wall-timeout", "4"], tmp_path, started)
    seen: set[int] = set()
    while proc.poll() is None:
        seen.update(descendants(proc.pid))
        time.sleep(0.1)
    err = proc.stderr.read()
    assert proc.returncode == 124, err[-3000:]
    assert "exceeded --wall-timeout 4 s (model build included) and was stopped" in err
    assert len(seen) >= 2 and _all_gone(sorted(seen)) == []


@pytest.mark.runtime
def test_sigterm_to_check_leaves_no_process(tmp_path, started):
    proc = _start(["check", "--model", "tiny-llama", "--nproc", "2", "--hardware", "cpu", "--global-batch", "4",
                   "--seq-len", "32", "--rounds", "1000"], tmp_path, started)
    tree = _wait_for_workers(proc, "meshplan.runtime.closed_loop")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and "interrupted by SIGTERM" in err and "Traceback" not in err, err[-3000:]
    assert _all_gone(tree) == []
    assert _left_behind(tmp_path / "t") == []


SLEEPER = """
import subprocess, sys, time
from pathlib import Path

# A grandchild in a session of its own, as torchrun starts its workers.
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
Path(sys.argv[1]).write_text(str(child.pid))
time.sleep(600)
"""


def test_run_tree_timeout_kills_grandchildren_in_their_own_session(tmp_path):
    (tmp_path / "sleeper.py").write_text(textwrap.dedent(SLEEPER))
    pid_file = tmp_path / "pid"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    start = time.monotonic()
    done = run_tree([sys.executable, "-m", "sleeper", str(pid_file)], timeout_s=3, env=env)
    assert done.timed_out and done.returncode is None and done.stopped == 2
    assert time.monotonic() - start < 30
    assert not _alive(int(pid_file.read_text()))


# ------------------------------------------------------------------------------------------- one-line errors
BLOCK_TORCH = """
import sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError("No module named 'torch'", name="torch")
sys.meta_path.insert(0, NoTorch())
from meshplan.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("args", [
    ["run", "--plan", "plan.toml"],
    ["check", "--hardware", "cpu"],
    ["memcheck", "--layers", "1"],
    ["calibrate", "--out", "hw.toml"],
])
def test_missing_torch_says_how_to_install_the_runtime_extra(tmp_path, args):
    (tmp_path / "plan.toml").write_text(TINY)
    proc = subprocess.run([sys.executable, "-c", BLOCK_TORCH, *args], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "needs PyTorch" in lines[0] and "pip install -e '.[runtime]'" in lines[0] and "torch==2.13.0" in lines[0]


@pytest.mark.skipif(hostmod.visible_gpus() > 0, reason="a CUDA device is visible")
def test_gpu_check_without_a_gpu_fails_at_once(capsys):
    start = time.monotonic()
    assert main(["check", "--device", "cuda", "--nproc", "1", "--hardware", "h200"]) == 2
    assert "no CUDA device visible" in capsys.readouterr().err
    assert time.monotonic() - start < 30  # no calibration, no process


BAD = {
    "run --lr -1": (["run", "--plan", "{tiny}", "--lr", "-1"], "--lr = -1.0: must be a finite number > 0"),
    "run --steps 0": (["run", "--plan", "{tiny}", "--steps", "0"], "--steps = 0: must be >= 1"),
    "run --timeout 0": (["run", "--plan", "{tiny}", "--timeout", "0"], "--timeout = 0.0"),
    "run --wall-timeout -5": (["run", "--plan", "{tiny}", "--wall-timeout", "-5"], "--wall-timeout = -5.0"),
    "run --nproc 0": (["run", "--plan", "{tiny}", "--nproc", "0"], "--nproc = 0: must be >= 1"),
    "run --checkpoint-every -1": (["run", "--plan", "{tiny}", "--checkpoint-every", "-1"], "must be >= 0"),
    "run --resume alone": (["run", "--plan", "{tiny}", "--resume"], "needs --checkpoint-dir"),
    "run --profile 99": (["run", "--plan", "{tiny}", "--profile", "99", "--out", "{tmp}/o"], "steps are 1..10"),
    "run missing plan": (["run", "--plan", "{tmp}/none.toml"], "no such file"),
    "run plan without model": (["run", "--plan", "{nomodel}"], "names no model"),
    "run --out is a file": (["run", "--plan", "{tiny}", "--out", "{tiny}"], "is a file; give a folder"),
    "run --checkpoint-dir is a file": (["run", "--plan", "{tiny}", "--checkpoint-dir", "{tiny}"], "is a file"),
    "run --data binary": (["run", "--plan", "{tiny}", "--data", "{binary}"], "is not UTF-8 text"),
    "run --data too short": (["run", "--plan", "{tiny}", "--data", "{short}"], "has 6 bytes, needs more than"),
    "run --data folder": (["run", "--plan", "{tiny}", "--data", "{tmp}"], "must be 'synthetic', 'corpus' or a"),
    "run world mismatch": (["run", "--plan", "{tiny}", "--nproc", "3"], "the world has 3"),
    "memcheck --stages abc": (["memcheck", "--stages", "abc"], "--stages = 'abc': first, last or pipeline ranks"),
    "memcheck --stages 7 of 2": (["memcheck", "--pp", "2", "--layers", "2", "--stages", "7"],
                                 "pipeline ranks 0..1 of the plan's pp=2"),
    "memcheck --layers -1": (["memcheck", "--layers", "-1"], "--layers = -1: must be >= 0"),
    "memcheck --layers below pp": (["memcheck", "--pp", "4", "--layers", "1"], "needs at least 4 layers"),
    "memcheck zero-bubble": (["memcheck", "--pp", "2", "--layers", "2", "--schedule", "zb_h1"], "--schedule"),
    "check --nproc 0": (["check", "--nproc", "0"], "--nproc = 0: must be >= 1"),
    "check --timeout 0": (["check", "--timeout", "0"], "--timeout = 0.0"),
    "check --seq-len 0": (["check", "--seq-len", "0"], "--seq-len = 0"),
    "check --hardware missing": (["check", "--hardware", "{tmp}/none.toml"], "no such file"),
    "check too big a model": (["check", "--model", "llama3-70b", "--hardware", "cpu"], "GiB of host memory"),
    "calibrate --out folder": (["calibrate", "--out", "{tmp}"], "is a folder; give a file name"),
    "calibrate --out no folder": (["calibrate", "--out", "{tmp}/no/hw.toml"], "the folder"),
    "calibrate --raw missing": (["calibrate", "--out", "{tmp}/hw.toml", "--raw", "{tmp}/none.json"], "cannot be read"),
    "calibrate --raw not json": (["calibrate", "--out", "{tmp}/hw.toml", "--raw", "{tiny}"], "is not JSON"),
    "calibrate --min-time 0": (["calibrate", "--out", "{tmp}/hw.toml", "--min-time", "0"], "--min-time = 0.0"),
    "calibrate --base unknown": (["calibrate", "--out", "{tmp}/hw.toml", "--base", "nope"], "unknown gpu"),
}


@pytest.fixture
def files(tmp_path) -> dict:
    (tmp_path / "tiny.toml").write_text(TINY)
    (tmp_path / "nomodel.toml").write_text(TINY.replace('model = "tiny-llama"\n', ""))
    (tmp_path / "binary.dat").write_bytes(bytes(range(128, 256)) * 8)
    (tmp_path / "short.txt").write_text("short\n")
    return {"tmp": str(tmp_path), **{p.stem: str(p) for p in tmp_path.iterdir()}}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_ends_in_one_line_and_exit_2(case, files, capsys, monkeypatch):
    args, expected = BAD[case]
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail(f"{case} started a process: {a[0]}"))
    assert main([a.format(**files) for a in args]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0] and "Traceback" not in err, err


# ------------------------------------------------------------------------------------------------- output
def test_check_and_memcheck_tables_fit_80_columns(capsys, monkeypatch):
    from meshplan.cli.check import add_memory, print_table
    from meshplan.cli.memcheck import ROWS, print_rows

    monkeypatch.setenv("COLUMNS", "80")
    labels = ["fsdp2 mb2 rc=selective", "pp2 interleaved_1f1b vpp2 mb2 rc=full", "tp2+sp mb4", "dp2 mb2"]
    result = {"plans": [{"plan": lab, "predicted_s": 0.123, "measured_s": 10.234, "error_pct": -47.4,
                         "predicted_rank": i + 1, "measured_rank": 4 - i, "chosen": i == 0}
                        for i, lab in enumerate(labels)], "mape_pct": 20.0, "kendall_tau": 0.5, "regret_pct": 3.0}
    add_memory(result, [2.1 * GiB] * 4, [2.0 * GiB] * 4)
    print_table(result)
    row = {"stage": 3, "rank": 6, "rows": [{"row": r, "measured": 1e10, "predicted": 1.1e10} for r in ROWS],
           "predicted": {"reserved": GiB, "capacity": 74.5 * GiB}, "peak_measured": 2.2e10,
           "peak_predicted": 2.1e10, "peak_error_pct": -2.3, "fits_measured": True, "fits_predicted": True}
    print_rows([row], "llama3.1-8b (4 layers) on 8xh100-sxm")
    out = capsys.readouterr().out
    assert "interleaved_1f1b" in out and "AdamW moments" in out
    assert max(len(line) for line in out.splitlines()) <= 80, out
