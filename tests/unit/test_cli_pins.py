"""What the user pins is honoured or refused in one line naming the flag (or the plan file's field), with exit 2
(4 where nothing fits), never a traceback: memcheck, report/explain, check, replan and demo."""

import pytest

from meshplan.cli import main

PLAN = """model = "llama3-8b"
gpus = "{gpus}"

[plan]
global_batch = 64
seq_len = 4096
micro_batch = 2
dp = {dp}
zero = 3
{extra}"""


def _write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.fixture
def files(tmp_path) -> dict:
    """Plan files: valid on 8 and 16 GPUs, and ones whose references or [predicted] table are wrong."""
    p8 = PLAN.format(gpus="8xh100-sxm", dp=8, extra="")
    out = {"p8": _write(tmp_path, "p8.toml", p8),
           "p16": _write(tmp_path, "p16.toml", PLAN.format(gpus="16xh100-sxm", dp=16, extra="")),
           "badmodel16": _write(tmp_path, "badmodel16.toml", PLAN.format(gpus="16xh100-sxm", dp=16, extra="")
                                .replace("llama3-8b", "no-such-model")),
           "nogpus": _write(tmp_path, "nogpus.toml", p8.replace('gpus = "8xh100-sxm"\n', "")),
           "badgpus": _write(tmp_path, "badgpus.toml", p8.replace('"8xh100-sxm"', '"bogus"')),
           "mixed": _write(tmp_path, "mixed.toml", PLAN.format(gpus="8xa100-80gb+8xh100-sxm", dp=16, extra="")),
           "mmf_str": _write(tmp_path, "mmf_str.toml", p8 + "\n[predicted]\nmax_memory_fraction = 'z'\n"),
           "mmf_neg": _write(tmp_path, "mmf_neg.toml", p8 + "\n[predicted]\nmax_memory_fraction = -5\n"),
           "mmf_nan": _write(tmp_path, "mmf_nan.toml", p8 + "\n[predicted]\nmax_memory_fraction = nan\n"),
           "pred_int": _write(tmp_path, "pred_int.toml", p8.replace("\n[plan]", "predicted = 5\n\n[plan]"))}
    return out


def _one_line(capsys, code: int, argv: list[str]) -> str:
    """Run ``meshplan argv``; assert the exit status and one error line without a traceback; return it."""
    assert main(argv) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# memcheck (5, 38, 55): every refusal comes before torch is imported or a rank is traced.
@pytest.mark.parametrize("args, needle", [
    (["--tp", "0"], "--tp = 0: must be >= 1"),
    (["--pp", "0"], "--pp = 0: must be >= 1"),
    (["--ep", "0"], "--ep = 0: must be >= 1"),
    (["--dp", "-1"], "--dp = -1: must be >= 0"),
    (["--tp", "3"], "--tp = 3: tp x pp = 3 does not divide the 8 GPUs"),
    (["--pp", "3"], "--pp = 3: tp x pp = 3 does not divide"),
    (["--zero", "2", "--tp", "8"], "--zero = 2: shards state over data parallelism, and this layout has dp = 1"),
    (["--plan", "{p8}", "--tp", "4"], "--tp = 4: the layout comes from --plan"),
    (["--plan", "{p8}", "--no-sp"], "--no-sp = False: the layout comes from --plan"),
    (["--plan", "{p8}", "--global-batch", "8"], "--global-batch = 8: the layout comes from --plan"),
    (["--plan", ""], "--plan = '': must name a plan file"),
    # the file's GPUs are used (16 fit its dp = 16), so the check that fails is the next one
    (["--plan", "{p16}", "--stages", "5"], "--stages = '5'"),
    (["--plan", "{p16}", "--gpus", "8xh100-sxm"], "--gpus = '8xh100-sxm': has 8 GPUs, the plan needs 16"),
    (["--plan", "{badmodel16}", "--stages", "0"], "no-such-model"),  # the file's model is the one resolved
    (["--plan", "{badmodel16}", "--model", "llama3-8b", "--stages", "5"], "--stages = '5'"),  # the flag wins
    (["--plan", "{badgpus}"], "badgpus.toml.gpus = 'bogus': expected COUNTxGPU"),
])
def test_memcheck_pins(files, capsys, args, needle):
    line = _one_line(capsys, 2, ["memcheck", *(a.format(**files) for a in args)])
    assert needle in line


# report / explain (28, 29, 42): the file's [predicted] limit is checked as --max-memory-fraction is (by
# load_report, or before it by read_plan_file: the words may differ, the field and value may not).
@pytest.mark.parametrize("command", [["explain", "--no-variants"], ["report", "--no-variants", "-o", "{out}"]])
@pytest.mark.parametrize("key, needle", [
    ("mmf_str", ".predicted.max_memory_fraction = 'z': must be "),
    ("mmf_neg", ".predicted.max_memory_fraction = -5: must be "),
    ("mmf_nan", ".predicted.max_memory_fraction = nan: must be "),
    ("pred_int", ".predicted = 5: must be "),
])
def test_report_checks_the_files_memory_limit(files, tmp_path, capsys, command, key, needle):
    argv = [a.format(out=str(tmp_path / "r.html")) for a in command] + [files[key]]
    line = _one_line(capsys, 2, argv)
    assert files[key] + needle in line
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("predicted, field", [
    (5, "f.toml.predicted"), ({"max_memory_fraction": "z"}, "f.toml.predicted.max_memory_fraction"),
    ({"max_memory_fraction": -5}, "f.toml.predicted.max_memory_fraction"),
    ({"max_memory_fraction": float("nan")}, "f.toml.predicted.max_memory_fraction"),
    ({"max_memory_fraction": True}, "f.toml.predicted.max_memory_fraction"),
])
def test_file_fraction_is_checked_like_the_flag(predicted, field):
    from meshplan.cli.report import file_fraction
    from meshplan.errors import SpecError

    with pytest.raises(SpecError) as exc:
        file_fraction("f.toml", {"predicted": predicted})
    assert exc.value.field == field
    assert file_fraction("f.toml", {"predicted": {"max_memory_fraction": 0.84}}) == 0.84
    assert file_fraction("f.toml", {}) is None


def test_explain_flag_limit_is_checked(files, capsys):
    assert "--max-memory-fraction = nan" in _one_line(capsys, 2, ["explain", files["p8"], "--max-memory-fraction",
                                                                   "nan"])


# check (39): training-only flags with --serve are refused, as is an empty --micro-batches; nothing starts.
@pytest.mark.parametrize("args, needle", [
    (["--serve", "--stat", "median"], "--stat = 'median': is a flag of the training check"),
    (["--serve", "--global-batch", "8"], "--global-batch = 8: is a flag of the training check"),
    (["--serve", "--seq-len", "64"], "--seq-len = 64"),
    (["--serve", "--micro-batches", "1,2"], "--micro-batches = '1,2'"),
    (["--serve", "--all"], "--all = True"),
    (["--serve", "--warmup", "0"], "--warmup = 0"),
    (["--serve", "--rounds", "5"], "--rounds = 5"),  # the default's value, but given: still not read
    (["--micro-batches", ""], "--micro-batches = '': comma-separated positive integers"),
    (["--micro-batches", " "], "--micro-batches = ' '"),
    (["--micro-batches", "1,,2"], "--micro-batches = '1,,2'"),
    (["--rounds", "0"], "--rounds = 0: must be >= 1"),
])
def test_check_pins(capsys, monkeypatch, args, needle):
    import subprocess

    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail(f"started a process: {a[0]}"))
    assert needle in _one_line(capsys, 2, ["check", *args])


# replan (40, 41, 46, 49, 50)
@pytest.mark.parametrize("args, needle", [
    (["--lose", "1", "--gpus", "16xh100-sxm"], "--gpus = '16xh100-sxm': gives the new cluster as a whole and "
                                               "cannot be combined with --lose"),
    (["--add", "8xh100-sxm", "--gpus", "4xh100-sxm"], "cannot be combined with --add"),
    (["--lose-ranks", "3", "--gpus", "4xh100-sxm"], "cannot be combined with --lose-ranks"),
    (["--lose-ranks", "1,1,1"], "--lose-ranks = '1,1,1': names rank 1 more than once"),
    (["--lose-ranks", "0-3,2"], "names rank 2 more than once"),
    (["--lose", "1", "--lose-ranks", "7"], "--lose-ranks = '7': rank 7 is also one of the last 1 that --lose 1"),
    (["--lose", "1", "--slow-gpu", "3:0.5", "--slow-gpu", "3:0.9"], "--slow-gpu = '3:0.9': GPU id 3 is given more "
                                                                    "than once"),
    (["--slow-link", "0:0.5", "--slow-link", "0:0.9"], "--slow-link = '0:0.9'"),
    (["--lose", "1", "--storage-gbs", "nan"], "--storage-gbs = nan: must be a finite bandwidth"),
    (["--lose", "1", "--storage-gbs", "inf"], "--storage-gbs = inf"),
    (["--phase", "generate", "--output-len", "1000000"], "--input-len + --output-len = 1001024: exceeds "
                                                         "llama3-8b's 8,192 positions"),
    (["--add", "0xh100-sxm"], "--add = '0xh100-sxm': expected COUNTxGPU"),
    (["--add", "bogus"], "--add = 'bogus'"),
    (["--gpus", "bogus"], "--gpus = 'bogus'"),
    (["--lose-ranks", "8-15"], "--lose-ranks = '8-15': rank 8 is not in the old world, 0..7"),
    (["--lose-ranks", "0-99999999999"], "rank 8 is not in the old world"),
    (["--lose-ranks", "0-7"], "--lose-ranks = '0-7': leaves none of the 8 GPUs"),
    (["--engine", "sglang"], "--engine = 'sglang': applies only with --phase generate"),
    (["--input-len", "5"], "--input-len = 5: applies only"),
    (["--rollouts", "3"], "--rollouts = 3: applies only"),
    (["--phase", "generate", "--storage-gbs", "7"], "--storage-gbs = 7.0: prices a cluster change's switch"),
])
def test_replan_pins(files, capsys, args, needle):
    assert needle in _one_line(capsys, 2, ["replan", "--from", files["p8"], *args])


def test_replan_names_the_old_clusters_source(files, capsys):
    line = _one_line(capsys, 2, ["replan", "--from", files["nogpus"], "--lose", "1"])
    assert line.startswith("error: --old-gpus = None: is required")
    line = _one_line(capsys, 2, ["replan", "--from", files["mixed"], "--lose", "1"])
    assert f"{files['mixed']}.gpus = '8xa100-80gb+8xh100-sxm': replan supports a cluster of one GPU type" in line
    line = _one_line(capsys, 2, ["replan", "--from", files["mixed"], "--old-gpus", "8xa100-80gb+8xh100-sxm"])
    assert "--old-gpus = '8xa100-80gb+8xh100-sxm'" in line
    line = _one_line(capsys, 2, ["replan", "--from", files["p8"], "--old-gpus", "bogus", "--lose", "1"])
    assert line.startswith("error: --old-gpus = 'bogus': expected COUNTxGPU")
    line = _one_line(capsys, 2, ["replan", "--from", files["badgpus"], "--lose", "1"])
    assert f"{files['badgpus']}.gpus = 'bogus': expected COUNTxGPU" in line


def test_replan_gpus_alone_still_works(files, capsys):
    assert main(["replan", "--from", files["p8"], "--gpus", "4xh100-sxm", "--json"]) == 0
    assert '"new_gpus": "4xh100-sxm"' in capsys.readouterr().out


# demo (45)
def test_demo_exits_4_when_nothing_fits_and_states_the_limit_it_uses(capsys):
    from meshplan.search import SearchRequest

    limit = SearchRequest(global_batch=1536, seq_len=2048).max_memory_fraction
    assert main(["demo", "--gpus", "1xa100-80gb"]) == 4
    out = capsys.readouterr().out
    assert f"peak memory under {100 * limit:.0f} % of each GPU" in out.splitlines()[0]
