"""The bad-input battery: one representative of each class a new user tried, each ending in one clear line on
stderr and a non-zero exit (2 for bad input, 4 for a valid request nothing fits), never a traceback, a hang or
a silent exit 0; then a hypothesis fuzzer over the planning commands' flags and malformed files."""

from __future__ import annotations

import signal
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshplan.cli import main

BASE = ["--model", "llama3-8b", "--gpus", "8xh100-sxm", "--global-batch", "8", "--seq-len", "4096"]
HANG_S = 60
"""No command may take longer on bad input (a loaded 2-core machine runs the worst real search in ~10 s)."""


@contextmanager
def deadline(seconds: int):
    """Fail instead of hanging: SIGALRM raises inside the command after ``seconds``."""
    def boom(*_):
        raise TimeoutError(f"command still running after {seconds} s")
    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def run(args: list[str], capsys) -> tuple[int, str, str]:
    with deadline(HANG_S):
        code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def files(tmp_path):
    """Malformed and hand-edited inputs."""
    f = {"binary": tmp_path / "bin.toml", "empty": tmp_path / "empty.toml", "json": tmp_path / "bad.json",
         "tp3": tmp_path / "tp3.toml", "csv": tmp_path / "s.csv", "runs_hdr": tmp_path / "hdr.csv",
         "dir": tmp_path}
    f["binary"].write_bytes(b"\x00\xff\xfe garbage")
    f["empty"].write_text("")
    f["json"].write_text("{bad json")
    f["tp3"].write_text('model = "llama3-8b"\ngpus = "8xh100-sxm"\n[plan]\nglobal_batch = 8\nseq_len = 4096\n'
                        "tp = 3\ndp = 1\n")
    f["csv"].write_text("x,y\n")
    f["runs_hdr"].write_text("id,arch,n_layers,hidden,ffn_hidden,n_heads,vocab,seq_len,global_batch,gpu,n_gpus,tp,"
                             "pp,dp,step_time_s\n")
    return {k: str(v) for k, v in f.items()}


# (arguments, exit status, a phrase the one line must hold); {name} is a file from the fixture.
CASES = [
    # pins the search used to ignore or answer with a generic "nothing fits"
    (["plan", *BASE, "--schedule", "foo"], 2, "unknown schedule"),
    (["plan", *BASE, "--recompute", "partial"], 2, "none, selective, full"),
    (["plan", *BASE, "--cp-kind", "foo"], 2, "ring, a2a"),
    (["plan", *BASE, "--tp", "3"], 2, "must divide the 32 attention heads"),
    (["plan", *BASE, "--zero", "5"], 2, "must be 0, 1, 2 or 3"),
    (["plan", *BASE, "--ep", "4"], 2, "needs a mixture-of-experts model"),
    (["plan", *BASE, "--schedule", "zbv"], 2, "megatron-core runs the pipeline schedules"),
    (["plan", *BASE, "--schedule", "1f1b", "--pp", "1"], 2, "needs a pipeline"),
    (["plan", *BASE, "--tp", "-1"], 2, "--tp"),
    (["plan", *BASE, "--dp-shard", "-1"], 2, "dp_shard"),
    (["plan", *BASE, "--recompute-layers", "-2"], 2, "recompute_layers"),
    (["plan", *BASE, "--etp", "-1"], 2, "--etp"),
    # prices
    (["plan", *BASE, "--price", "-1"], 2, "positive price"),
    (["plan", *BASE, "--price", "0"], 2, "positive price"),
    (["plan", *BASE, "--price", "a100-80gb=2"], 2, "not in the cluster"),
    (["plan", *BASE, "--price", "abc"], 2, "NUMBER"),
    # a cluster no batch can fill (used to hang)
    (["plan", "--model", "llama3-8b", "--gpus", "1000000000xh100-sxm", "--global-batch", "128", "--seq-len",
      "4096"], 2, "cannot all be used"),
    # numbers and usage
    (["estimate", *BASE, "--tp", "0"], 2, "--tp"),
    (["estimate", *BASE, "--precision", "fp9"], 2, "fp32, bf16, fp16, fp8"),
    (["plan", *BASE, "--global-batch", "x"], 2, "valid integer"),
    (["plan", "--model", "llama3-8b"], 2, "Missing option"),
    (["plan", *BASE, "--no-such-flag"], 2, "No such option"),
    (["bogus"], 2, "No such command"),
    (["plan", *BASE, "--max-memory-fraction", "0"], 2, "max_memory_fraction"),
    # files: missing, malformed, folders, unwritable
    (["estimate", *BASE, "--pp", "2", "--schedule-file", "/nonexistent.csv"], 2, "is not a file"),
    (["estimate", *BASE, "--pp", "2", "--schedule-file", "{csv}"], 2, "bad action token"),
    (["estimate", *BASE, "--trace", "/nonexistent/x.json"], 2, "does not exist"),
    (["estimate", *BASE, "--trace", "{dir}"], 2, "is a folder"),
    (["plan", *BASE, "--out", "/nonexistent/x.toml"], 2, "does not exist"),
    (["estimate", "--plan", "{binary}"], 2, "cannot be parsed"),
    (["estimate", "--model", "{json}", "--gpus", "8xh100-sxm", "--global-batch", "8", "--seq-len", "64"], 2,
     "cannot be parsed"),
    (["explain", "{empty}"], 2, "is required"),
    (["explain", "{dir}"], 2, "is a folder"),
    (["report", "{tp3}", "-o", "{dir}"], 2, "is a folder"),
    # a hand-edited plan is checked before anything is exported
    (["export", "{tp3}", "--to", "megatron"], 2, "must divide the 32 attention heads"),
    (["export", "{tp3}", "--to", "foo"], 2, "unknown exporter"),
    # validate: nothing to score is an error, not exit 0
    (["validate", "{empty}"], 2, "missing columns"),
    (["validate", "{tp3}"], 2, "missing columns"),
    (["validate", "{runs_hdr}"], 2, "has no rows"),
    (["validate", "/nonexistent.csv"], 2, "no such file"),
    # stacks
    (["plan", *BASE, "--framework", "megatronn"], 2, "did you mean"),
    (["plan", *BASE, "--framework", "deepspeed-2021", "--tp-comm-overlap"], 2, "cannot overlap TP"),
    (["plan", "--model", "llama3-8b", "--gpus", "8xv100", "--global-batch", "8", "--seq-len", "64",
      "--precision", "fp8"], 2, "FP8 tensor cores"),
]


@pytest.mark.parametrize(("args", "code", "phrase"), CASES, ids=[" ".join(c[0][:1] + c[0][9:12]) or c[0][0]
                                                                  for c in CASES])
def test_bad_input_ends_in_one_clear_line(args, code, phrase, files, capsys):
    got, _, err = run([a.format(**files) for a in args], capsys)
    assert got == code, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert phrase in lines[0]


def test_negative_step_time_is_not_scored(tmp_path, capsys, runs_csv):
    import csv

    from meshplan.calibrate.runs import REQUIRED

    src = tmp_path / "neg.csv"
    with open(runs_csv, newline="") as fh:
        row = next(csv.DictReader(fh))
    row["step_time_s"] = "-" + row["step_time_s"]
    with src.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(row))
        w.writeheader()
        w.writerow(row)
    assert set(REQUIRED) <= set(row)
    code, _, err = run(["validate", str(src)], capsys)
    assert code == 2 and "step_time_s must be a positive number" in err


def test_valid_request_that_nothing_fits_keeps_exit_4(capsys):
    code, out, _ = run(["plan", "--model", "llama3.1-405b", "--gpus", "8xh100-sxm", "--global-batch", "8",
                        "--seq-len", "8192"], capsys)
    assert code == 4 and "NOTHING FITS" in out and "smallest cluster that fits" in out


# --- the fuzzer ------------------------------------------------------------------------------------------------

NUMBERS = st.one_of(st.integers(-3, 70), st.sampled_from(["0", "-1", "1e9", "nan", "inf", "x", "", "3.5",
                                                          "1000000000"]))
NAMES = st.sampled_from(["llama3-8b", "tiny-llama", "mixtral-8x7b", "nope", "", "8xh100-sxm", "{json}", "{binary}",
                         "{empty}", "{csv}", "{dir}", "1f1b", "zbv", "a2a", "full", "fp8", "bf16"])
FLAGS = {"--tp": NUMBERS, "--pp": NUMBERS, "--cp": NUMBERS, "--dp": NUMBERS, "--ep": NUMBERS, "--vpp": NUMBERS,
         "--zero": NUMBERS, "--etp": NUMBERS, "--dp-shard": NUMBERS, "--recompute-layers": NUMBERS,
         "--micro-batch": NUMBERS, "--global-batch": NUMBERS, "--seq-len": NUMBERS,
         "--schedule": NAMES, "--recompute": NAMES, "--cp-kind": NAMES, "--precision": NAMES, "--model": NAMES,
         "--gpus": st.one_of(NAMES, st.builds(lambda n, g: f"{n}x{g}", st.integers(-1, 10**6),
                                              st.sampled_from(["h100-sxm", "a100-80gb", "cpu", "nope"]))),
         "--price": st.one_of(NUMBERS, NAMES), "--framework": NAMES, "--max-memory-fraction": NUMBERS}
PLAN_ONLY = {"--price", "--max-memory-fraction"}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(["plan", "estimate"]),
       flags=st.dictionaries(st.sampled_from(sorted(FLAGS)), st.none(), min_size=0, max_size=7),
       data=st.data())
def test_fuzzed_flags_never_traceback_or_hang(command, flags, data, files, capsys):
    args = [command]
    for flag in flags:
        if command == "estimate" and flag in PLAN_ONLY:
            continue
        value = data.draw(FLAGS[flag], label=flag)
        args += [flag, str(value).format(**files)]
    code, out, err = run(args, capsys)
    assert code in (0, 2, 3, 4), (args, err)
    if code == 2:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, err)
    assert "Traceback" not in out + err


PLAN_TEXT = 'model = "llama3-8b"\ngpus = "8xh100-sxm"\n[plan]\nglobal_batch = 8\nseq_len = 4096\ntp = 2\ndp = 4\n'


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from([["validate"], ["explain", "--no-variants"], ["export", "--to", "megatron"],
                                ["estimate", "--plan"]]),
       content=st.one_of(st.binary(max_size=64), st.text(max_size=200).map(str.encode),
                         st.integers(0, len(PLAN_TEXT)).map(lambda n: PLAN_TEXT[:n]),
                         st.tuples(st.sampled_from(["tp", "dp", "zero", "seq_len", "micro_batch", "recompute"]),
                                   st.sampled_from(["0", "-1", "3", '"x"', "1e99", "[1]", "true"]))
                         .map(lambda kv: PLAN_TEXT.replace("tp = 2", f"{kv[0]} = {kv[1]}"))).map(
           lambda c: c if isinstance(c, bytes) else c.encode()))
def test_fuzzed_files_never_traceback_or_hang(command, content, tmp_path, capsys):
    path = tmp_path / "input.toml"
    path.write_bytes(content)
    args = command[:1] + ([str(path)] + command[1:] if command[0] != "estimate" else command[1:] + [str(path)])
    code, out, err = run(args, capsys)
    assert code in (0, 2, 3), (content, err)
    if code == 2:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), (content, err)


@pytest.mark.parametrize("command", ["plan", "estimate"])
def test_help_lists_the_valid_values(command, capsys, monkeypatch):
    """--help names every schedule in the registry, the ZeRO stages and the recompute modes (and, for plan's
    pins, what 0 means)."""
    from meshplan.spec.schedules import schedule_names

    monkeypatch.setenv("COLUMNS", "1000")  # one line per option, so no value is broken across lines
    assert main([command, "--help"]) == 0
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    for name in schedule_names():
        assert name in text, name
    assert "0, 1, 2 or 3" in text and "none" in text and "selective" in text
    if command == "plan":
        assert "0 = the search chooses" in text


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    """Ctrl-C during a search: one line on stderr, exit 130 (not the framework's silent 130 or a traceback)."""
    import os
    import time

    import meshplan.search

    def interrupted_search(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
        raise AssertionError("SIGINT did not interrupt")

    monkeypatch.setattr(meshplan.search, "search", interrupted_search)
    code, _, err = run(["plan", *BASE], capsys)
    assert code == 130 and err.strip() == "interrupted (Ctrl-C)"
