"""Supervised child processes: a torchrun launched by meshplan, and every process under it, lives and dies with
meshplan.

torchrun starts each worker in a session of its own (torch.distributed.elastic's SubprocessHandler passes
``start_new_session=True``), so neither a terminal's Ctrl-C nor a kill of torchrun's process group reaches the
workers, and a worker whose torchrun died keeps running under PID 1 (issue 13: a SIGTERM to ``meshplan run``
left 64 workers behind). Three layers tie the tree to meshplan (Linux; elsewhere only the second applies):

1. while it supervises, meshplan is a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``): a worker orphaned by a
   dead torchrun is re-parented to meshplan, where a walk of /proc still finds it;
2. on every way out (exit, error, wall timeout, SIGINT, SIGTERM, SIGHUP) ``kill_tree`` SIGKILLs every
   descendant, walks again until none is left (a process forked meanwhile is found on the next pass) and reaps
   those re-parented to meshplan. SIGKILL, not SIGTERM: torchrun answers SIGTERM with a traceback per process,
   and the runtime's checkpoints are atomic (written to ``step-N.tmp``, renamed when complete);
3. torchrun and each worker ask the kernel for SIGKILL when their parent dies (``die_with_parent``), which
   covers a meshplan killed by SIGKILL, where no handler runs.

The child gets a private TMPDIR inside a folder meshplan removes: torchrun's log folders (``torchelastic_*``) and
whatever the workers put in tempfile's directory go with it. torch is never imported here.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
"""prctl(2) options (linux/prctl.h)."""

SUPERVISOR_ENV = "MESHPLAN_SUPERVISOR_PID"
"""Set in the supervised torchrun: its workers check that this pid is still their parent after arming the
death signal (the parent may die between fork and prctl)."""

STOP_SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)


class Interrupted(Exception):
    """A stop signal reached meshplan; the supervised processes are already gone when this propagates."""

    def __init__(self, signum: int, stopped: int = 0):
        self.signum, self.stopped = signum, stopped
        super().__init__(self._text())

    def _text(self) -> str:
        what = f"; stopped {self.stopped} process{'es' if self.stopped != 1 else ''}" if self.stopped else ""
        return f"interrupted by {signal.Signals(self.signum).name}{what}"

    @property
    def exit_code(self) -> int:
        """The shell's convention: 128 + signal number (130 for SIGINT, 143 for SIGTERM)."""
        return 128 + self.signum


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (torchrun, or meshplan for torchrun), and exit
    at once if the supervising parent is already gone. A no-op off Linux."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    expected = os.environ.get(SUPERVISOR_ENV)
    # The supervised process itself runs its module in-process (runpy): then the expected pid is its own.
    if expected and int(expected) not in (os.getppid(), os.getpid()):
        os._exit(137)


# ------------------------------------------------------------------------------------------- process tree
def _parents() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state letter) of every process in /proc."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        out[int(name)] = (int(fields[1]), fields[0])
    return out


def descendants(root: int, *, skip: frozenset[int] = frozenset()) -> list[int]:
    """Every living descendant of ``root`` (zombies excluded), not entering the subtrees of ``skip``."""
    if not os.path.isdir("/proc"):
        return []
    table = _parents()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, stack = [], [root]
    while stack:
        for c in children.get(stack.pop(), []):
            if c in skip:
                continue
            stack.append(c)
            if table[c][1] != "Z":
                out.append(c)
    return out


def _reap(*, spare: frozenset[int], keep: int | None) -> None:
    """Collect the exit status of our dead children outside ``spare`` (re-parented ranks), so none lingers as a
    zombie; ``keep`` is left to its Popen."""
    me = os.getpid()
    for pid, (ppid, state) in _parents().items():
        if ppid == me and state == "Z" and pid not in spare and pid != keep:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def kill_tree(*, spare: frozenset[int] = frozenset(), keep: int | None = None, patience_s: float = 10.0) -> int:
    """SIGKILL every descendant of this process outside ``spare`` (children that existed before supervision),
    until none is left or ``patience_s`` passed; returns how many were killed. ``keep``: a child whose Popen
    reaps it."""
    killed: set[int] = set()
    deadline = time.monotonic() + patience_s
    while True:
        alive = descendants(os.getpid(), skip=spare)
        if not alive or time.monotonic() > deadline:
            if os.path.isdir("/proc"):
                _reap(spare=spare, keep=keep)  # every one left is a zombie by now
            return len(killed)
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        time.sleep(0.05)


def _own_children() -> frozenset[int]:
    if not os.path.isdir("/proc"):
        return frozenset()
    me = os.getpid()
    return frozenset(pid for pid, (ppid, _) in _parents().items() if ppid == me)


# ------------------------------------------------------------------------------------------------ signals
_STOP = {"depth": 0, "hold": 0, "signum": None, "raised": False}
"""Signal dispositions are process-wide, so is this: the first stop signal, whether it was raised, how deep the
handler contexts and the cleanup holds are nested."""


def _on_stop(signum, frame):
    if _STOP["signum"] is not None:
        return  # already stopping: let the cleanup finish
    _STOP["signum"] = signum
    if not _STOP["hold"]:
        _STOP["raised"] = True
        raise Interrupted(signum)


@contextlib.contextmanager
def stop_signals_raise():
    """Within the block, the first SIGINT, SIGTERM or SIGHUP raises ``Interrupted`` in the main thread (later ones
    are ignored, so cleanup finishes); nested blocks share one handler. Outside the main thread, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    if _STOP["depth"] == 0:
        _STOP.update(signum=None, raised=False)
        previous = {s: signal.signal(s, _on_stop) for s in STOP_SIGNALS}
    _STOP["depth"] += 1
    try:
        yield
    finally:
        _STOP["depth"] -= 1
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def held():
    """Within the block a stop signal is recorded, not raised (``pending_stop`` tells it afterwards)."""
    _STOP["hold"] += 1
    try:
        yield
    finally:
        _STOP["hold"] -= 1


def pending_stop() -> int | None:
    """A stop signal that arrived while held and was not raised yet (then it counts as raised), else None."""
    if _STOP["signum"] is None or _STOP["raised"]:
        return None
    _STOP["raised"] = True
    return _STOP["signum"]


# ------------------------------------------------------------------------------------------------ launch
@dataclass(frozen=True, kw_only=True)
class Finished:
    """How a supervised command ended."""

    returncode: int | None
    """Exit status (negative: killed by that signal); None when meshplan stopped it at the wall timeout."""
    stdout: str | None
    """Captured standard output (None when it went to ours)."""
    stderr: str | None
    """Captured standard error (None when it went to ours)."""
    timed_out: bool
    """The wall timeout stopped it."""
    stopped: int
    """Processes meshplan had to kill (0 when the tree exited by itself)."""


def supervised_command(args: list[str]) -> list[str]:
    """``args`` (a python command line: ``[sys.executable, "-m", module, ...]``) run through ``python -m
    meshplan.runtime.procs``, which arms the death signal before handing over to the module."""
    if args[:2] != [sys.executable, "-m"]:
        raise ValueError(f"not a python -m command line: {args[:3]}")
    return [sys.executable, "-m", "meshplan.runtime.procs", *args[2:]]


def run_tree(args: list[str], *, timeout_s: float | None = None, capture: bool = False,
             env: dict | None = None) -> Finished:
    """Run ``args`` (``python -m MODULE ...``) and wait, so that neither it nor anything it starts outlives this
    call: stop signals and the wall timeout kill the whole tree (see the module docstring). A stop signal is
    raised as ``Interrupted`` once the tree is gone. ``capture``: keep stdout and stderr (text). Every process
    this one starts during the call counts as part of the tree (another thread's would be killed too)."""
    spare = _own_children()
    pipe = subprocess.PIPE if capture else None
    proc, out, err, timed_out, stopped, signum = None, None, None, False, 0, None
    with stop_signals_raise():
        subreaper = _prctl(PR_SET_CHILD_SUBREAPER, 1)
        tmp = tempfile.mkdtemp(prefix="meshplan-proc-")
        try:
            child_env = {**(env if env is not None else os.environ), "TMPDIR": tmp, SUPERVISOR_ENV: str(os.getpid())}
            proc = subprocess.Popen(supervised_command(args), stdout=pipe, stderr=pipe, text=True, env=child_env)
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        except Interrupted as exc:
            signum = exc.signum
        finally:
            with held():
                stopped = kill_tree(spare=spare, keep=proc.pid if proc else None)
                if proc is not None and proc.returncode is None:
                    out, err = _drain(proc)
                shutil.rmtree(tmp, ignore_errors=True)
                if subreaper:
                    _prctl(PR_SET_CHILD_SUBREAPER, 0)
            signum = signum or pending_stop()
    if signum is not None:
        raise Interrupted(signum, stopped)
    return Finished(returncode=None if timed_out else proc.returncode, stdout=out, stderr=err, timed_out=timed_out,
                    stopped=stopped)


def _drain(proc) -> tuple[str | None, str | None]:
    """Wait for a killed Popen and read what its pipes still hold."""
    if proc is None:
        return None, None
    try:
        return proc.communicate(timeout=10)
    except (subprocess.TimeoutExpired, ValueError, OSError):
        proc.kill()
        proc.wait()
        return None, None


def _exec_module(argv: list[str]) -> None:
    """``python -m meshplan.runtime.procs MODULE ARGS...``: arm the death signal, then run MODULE as ``-m``
    would, with this process's pid as the supervisor its own children check."""
    import runpy

    die_with_parent()
    os.environ[SUPERVISOR_ENV] = str(os.getpid())
    sys.argv = [argv[0], *argv[1:]]
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    _exec_module(sys.argv[1:])
