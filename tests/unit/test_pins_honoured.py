"""What a user pins is honoured or refused in one line, never dropped; numbers that cannot be (inf, NaN, a
billion clients) are refused before any work starts."""

from __future__ import annotations

import json

import pytest

from meshplan.cli import main

SERVE = ["serve", "--model", "llama3-8b", "--gpus", "8xh100-sxm", "--input-len", "1024", "--output-len", "256"]
EST = ["estimate", "--model", "llama3-8b", "--gpus", "8xh100-sxm", "--global-batch", "64", "--seq-len", "4096"]
PLAN = ["plan", "--model", "llama3-8b", "--gpus", "8xh100-sxm", "--global-batch", "64", "--seq-len", "4096"]


def _serve(*extra: str) -> list[str]:
    """``SERVE`` with ``extra`` flags replacing the ones they name."""
    argv = list(SERVE)
    for flag, value in zip(extra[::2], extra[1::2]):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    return argv


@pytest.fixture
def binary_file(tmp_path):
    path = tmp_path / "lengths.bin"
    path.write_bytes(b"\xff\xfe\x00garbage")
    return str(path)


@pytest.mark.parametrize("argv, needle", [
    (_serve("--input-len", "1024:inf"), "every weight a finite number"),
    (_serve("--input-len", "1024:1e308,2048:1e308"), "overflow"),
    (_serve("--input-len", "\u00b2"), "--input-len"),
    (_serve("--rate", "inf"), "--rate"),
    (_serve("--concurrency", "1000000000"), "at most 100,000 clients"),
    (_serve("--tpot-ms", "inf"), "--tpot-ms"),
    (_serve("--price", "inf"), "--price"),
    (_serve("--tp", "3"), "must be one of 1, 2, 4, 8"),
    (_serve("--pp", "3"), "--pp"),
    (_serve("--max-num-seqs", "100000000"), "at most 65,536"),
    (["serve", "--model", "mixtral-8x7b", "--gpus", "8xh100-sxm", "--input-len", "1024", "--output-len", "256",
      "--attn-dp", "3"], "power of two"),
    (EST + ["--dp-shard", "3"], "give --zero 1, 2 or 3"),
    (EST + ["--schedule", "gpipe"], "give --pp 2 or more"),
    (EST + ["--recompute-layers", "5"], "give --recompute full"),
    (EST + ["--recompute", "full", "--recompute-layers", "999"], "exceeds the 32 layers per pipeline rank"),
    (EST + ["--sp", "--tp", "1"], "give --tp 2 or more"),
    (EST + ["--tp", "3"], "must divide the 8 GPUs"),
    (PLAN + ["--sp", "--tp", "1"], "needs --tp 2 or more"),
    (PLAN + ["--framework", ""], "is empty: name a stack profile"),
    (PLAN + ["--price", "h100-sxm=2,h100-sxm=3"], "prices h100-sxm twice"),
    (["plan", "--model", "mixtral-8x7b", "--gpus", "8xh100-sxm", "--global-batch", "64", "--seq-len", "4096",
      "--ep", "2", "--etp", "3"], "etp=3 must be 1 or a tp degree"),
    (["plan", "--model", "mixtral-8x7b", "--gpus", "8xh100-sxm", "--global-batch", "64", "--seq-len", "4096",
      "--etp", "4", "--tp", "2"], "etp=4 must be 1 or the tp degree"),
    (_serve("--checkpoint", "org/model"), "applies to --export only"),
    (_serve("--gpus", "8xh100-sxm+8xserver"), "serving runs no parameter servers"),
    (PLAN[:5] + ["--global-batch", str(10**30), "--seq-len", "4096"], "must be at most 2,147,483,648"),
    (["demo", "--global-batch", str(10**30)], "must be at most 2,147,483,648"),
    (EST[:7] + ["--seq-len", str(10**30)], "must be at most 2,147,483,648"),
    (PLAN + ["--recompute-layers", "5", "--recompute", "none"], "recompute is pinned to none"),
    (PLAN + ["--recompute-layers", "1000000"], "exceeds llama3-8b's 32 layers"),
    (PLAN + ["--cp", "1", "--cp-kind", "a2a"], "cp is pinned to 1"),
    (EST + ["--cp-kind", "a2a"], "give --cp 2 or more"),
    (["memcheck", "--layers", str(10**30)], "exceeds llama3.1-8b's 32 layers per block"),
    (["memcheck", "--sp"], "give --tp 2 or more"),
])
def test_refused_in_one_line(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and err.count("\n") == 1


def test_an_unreadable_length_file_is_named(binary_file, capsys):
    assert main(_serve("--input-len", binary_file)) == 2
    err = capsys.readouterr().err
    assert "cannot be read as a text file" in err and "Traceback" not in err


def test_schedule_and_schedule_file_together_are_refused(tmp_path, capsys):
    path = tmp_path / "s.csv"
    path.write_text("0F0\n")
    assert main(EST + ["--pp", "2", "--schedule", "1f1b", "--schedule-file", str(path)]) == 2
    assert "give one" in capsys.readouterr().err


def _plans(argv, capsys) -> list[dict]:
    assert main(argv + ["--json", "--top", "3"]) == 0
    return json.loads(capsys.readouterr().out)["plans"]


def test_a_pinned_recompute_is_kept_where_less_would_fit(capsys):
    """Llama-3-8B at 4k tokens on 8 H100s fits without recompute; pinned full on 4 layers, or selective, every plan
    carries exactly that."""
    assert {p["recompute"] for p in _plans(PLAN, capsys)} == {"none"}
    full = _plans(PLAN + ["--recompute", "full", "--recompute-layers", "4"], capsys)
    assert {p["recompute"] for p in full} == {"full:4"}
    sel = _plans(PLAN + ["--recompute", "selective"], capsys)
    assert {p["recompute"] for p in sel} == {"selective"}


def test_a_pinned_sequence_parallelism_runs_only_over_tp_groups(capsys):
    plans = _plans(PLAN + ["--sp"], capsys)
    assert plans and all(p["plan"].get("sp") and p["plan"].get("tp", 1) > 1 for p in plans)


def test_explain_refuses_a_width_no_table_fits(tmp_path, capsys):
    plan = tmp_path / "p.toml"
    assert main(PLAN + ["--out", str(plan)]) == 0
    capsys.readouterr()
    assert main(["explain", str(plan), "--width", "1"]) == 2
    assert "40 to 1000 columns" in capsys.readouterr().err


def test_a_layer_count_alone_means_full_recompute_on_that_many(capsys):
    assert {p["recompute"] for p in _plans(PLAN + ["--recompute-layers", "5"], capsys)} == {"full:5"}


def test_a_pinned_kind_of_context_parallelism_runs_only_with_some(capsys):
    plans = _plans(PLAN + ["--cp-kind", "a2a"], capsys)
    assert plans and all(p["plan"].get("cp", 1) > 1 and p["plan"].get("cp_kind") == "a2a" for p in plans)


def test_a_pinned_hsdp_group_is_searched_as_pinned(capsys):
    """8 GPUs of one node: HSDP groups smaller than a node are not among the search's own candidates, but a pinned
    one is."""
    plans = _plans(PLAN + ["--dp", "8", "--zero", "3", "--dp-shard", "4"], capsys)
    assert plans and all(p["plan"].get("dp_shard") == 4 and p["plan"].get("zero") == 3 for p in plans)


def test_serve_only_disaggregated_says_aggregated_would_fit(capsys):
    assert main(_serve("--disagg", "only", "--tp", "8")) == 4
    out = capsys.readouterr().out
    assert "--disagg off serves it on these GPUs" in out


def test_export_says_when_the_plan_does_not_fit(tmp_path, capsys):
    plan = tmp_path / "p.toml"
    assert main(PLAN + ["--out", str(plan)]) == 0
    capsys.readouterr()
    assert main(["export", str(plan), "--to", "megatron", "--model", "llama3-70b"]) == 0
    assert "note: this plan does not fit" in capsys.readouterr().err


def test_replan_refuses_blank_lost_ranks(tmp_path, capsys):
    plan = tmp_path / "p.toml"
    assert main(PLAN + ["--out", str(plan)]) == 0
    capsys.readouterr()
    assert main(["replan", "--from", str(plan), "--lose-ranks", " "]) == 2
    assert "names no rank" in capsys.readouterr().err


def test_network_levels_must_nest():
    from meshplan import catalog
    from meshplan.errors import SpecError
    from meshplan.spec.cluster import NetworkLevel, Pool

    gpu = catalog.gpu("h100-sxm")
    lv = lambda span: NetworkLevel(name=f"l{span}", span=span, bandwidth=1e9, latency=0.0)  # noqa: E731
    with pytest.raises(SpecError, match="spans must grow"):
        Pool(gpu=gpu, n_gpus=8, levels=(lv(3), lv(5)))
    with pytest.raises(SpecError, match="spans must grow"):
        Pool(gpu=gpu, n_gpus=16, levels=(lv(8), lv(8)))
    assert Pool(gpu=gpu, n_gpus=64, levels=(lv(8), lv(64))).network()[-1].span == 64
