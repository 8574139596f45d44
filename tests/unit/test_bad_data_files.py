"""Data files a user feeds meshplan (validation CSVs, schedule CSVs, raw calibration timings): a bad cell or a
cut file is one line naming the row and field, never a traceback or a silent guess."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from meshplan.cli import main

SHARED = Path(__file__).resolve().parents[3] / "shared" / "validation"
RUNS, SERVING = SHARED / "runs_visible.csv", SHARED / "inference_visible.csv"
EST = ["estimate", "--model", "llama3-8b", "--gpus", "8xh100-sxm", "--global-batch", "64", "--seq-len", "4096",
       "--pp", "2", "--schedule-file"]

needs_data = pytest.mark.skipif(not RUNS.exists() or not SERVING.exists(), reason="shared/validation not present")


def one_row(src: Path, tmp_path: Path, **cells) -> str:
    """The first row of ``src`` with ``cells`` replaced, as a one-row CSV."""
    with src.open(newline="") as fh:
        reader = csv.DictReader(fh)
        row = next(reader) | cells
        fields = reader.fieldnames
    out = tmp_path / "one.csv"
    with out.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerow(row)
    return str(out)


def _fails(argv, needle, capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
    return err


@needs_data
@pytest.mark.parametrize("cells, needle", [
    ({"tp": "1.5"}, "tp = '1.5': must be a whole number"),
    ({"arch": "weird"}, "arch = 'weird': must be one of dense, moe"),
])
def test_a_bad_run_cell_is_named(cells, needle, tmp_path, capsys):
    _fails(["validate", one_row(RUNS, tmp_path, **cells)], needle, capsys)


@needs_data
def test_a_run_of_a_stack_without_a_profile_says_which_it_took(tmp_path, capsys):
    assert main(["validate", one_row(RUNS, tmp_path, framework="foo")]) == 0
    assert "no profile, took megatron-core" in capsys.readouterr().out


@needs_data
def test_an_upper_case_arch_is_read(tmp_path, capsys):
    assert main(["validate", one_row(RUNS, tmp_path, arch="Dense")]) == 0


@needs_data
@pytest.mark.parametrize("cells, needle", [
    ({"value": "x"}, "must be a positive, finite measurement"),
    ({"value": "inf"}, "must be a positive, finite measurement"),
    ({"n_gpus": "0"}, "n_gpus = '0': must be a whole number of GPUs >= 1"),
])
def test_a_bad_serving_cell_is_named(cells, needle, tmp_path, capsys):
    err = _fails(["validate", one_row(SERVING, tmp_path, **cells)], needle, capsys)
    assert "1 skipped" in err


@needs_data
def test_a_serving_file_without_rows_says_so(tmp_path, capsys):
    path = tmp_path / "empty.csv"
    path.write_text(SERVING.read_text().splitlines()[0] + "\n")
    _fails(["validate", str(path)], "it has no rows", capsys)


def test_a_binary_schedule_file(tmp_path, capsys):
    path = tmp_path / "s.csv"
    path.write_bytes(b"\xff\xfe0F0")
    _fails(EST + [str(path)], "is not a text CSV of actions", capsys)


def test_a_schedule_naming_a_huge_micro_batch_is_refused_before_tables_are_built(tmp_path, capsys):
    path = tmp_path / "s.csv"
    path.write_text("0F99999999999999999,0B99999999999999999\n")
    _fails(EST + [str(path)], "micro-batches must be numbered 0, 1, ... without gaps", capsys)


def test_raw_timings_without_their_dtype(tmp_path, capsys):
    raw = tmp_path / "raw.json"
    raw.write_text(json.dumps({"gemm": [], "attention": {}, "copy": {}, "collectives": []}))
    _fails(["calibrate", "--out", str(tmp_path / "hw.toml"), "--raw", str(raw)], "is incomplete or malformed",
           capsys)


@needs_data
@pytest.mark.parametrize("src", [RUNS, SERVING])
@pytest.mark.parametrize("delimiter, spell", [(";", str.upper), ("\t", lambda c: c.replace("_", " ").title()),
                                              (",", lambda c: c.replace("_", "-"))])
def test_a_spreadsheet_export_reads_as_the_original(tmp_path, src, delimiter, spell):
    """Header names in other cases or with spaces, and a semicolon or tab between cells, read as the file does."""
    from meshplan.calibrate.runs import load_runs
    from meshplan.calibrate.serve_validate import validate_serving_csv

    with src.open(newline="") as fh:
        rows = list(csv.reader(fh))[:6]
    out = tmp_path / "export.csv"
    with out.open("w", newline="") as fh:
        w = csv.writer(fh, delimiter=delimiter)
        w.writerow([spell(c) for c in rows[0]])
        w.writerows(rows[1:])
    with (tmp_path / "plain.csv").open("w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    if src == SERVING:
        got, want = validate_serving_csv(out), validate_serving_csv(tmp_path / "plain.csv")
        assert [(r.id, r.predicted) for r in got.rows] == [(r.id, r.predicted) for r in want.rows]
        assert len(got.rows) == 5
    else:
        (got, _), (want, _) = load_runs(out), load_runs(tmp_path / "plain.csv")
        assert [r.id for r in got] == [r.id for r in want] and len(got) == 5


@needs_data
def test_blank_header_cells_stay_distinct(tmp_path):
    from meshplan.calibrate.serve_validate import validate_serving_csv

    with SERVING.open(newline="") as fh:
        rows = list(csv.reader(fh))[:3]
    out = tmp_path / "blanks.csv"
    with out.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(rows[0] + ["", "  "])
        w.writerows(r + ["", ""] for r in rows[1:])
    assert len(validate_serving_csv(out).rows) == 2
