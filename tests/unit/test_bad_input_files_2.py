"""Bad input files, second round (fuzz findings): length files read strictly, CSV headers naming a column twice,
rows with stray cells, byte-order marks, empty paths, a plan file's [predicted] table, huge GPU counts, huge
values in error lines. Each is one line ``error: FIELD = VALUE: what would be valid``, exit 2, no traceback."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from meshplan.cli import main
from meshplan.errors import SpecError

BOM = "\ufeff"
RUNS_HEADER = ("id,source,model,arch,n_layers,hidden,ffn_hidden,n_heads,n_kv_heads,vocab,seq_len,n_experts,top_k,"
               "moe_ffn_hidden,n_shared_experts,global_batch,micro_batch,gpu,n_gpus,gpus_per_node,tp,pp,dp,cp,ep,vpp,"
               "zero,recompute,sp,precision,framework,framework_version,step_time_s,step_time_basis,"
               "reported_metric,reported_value,flops_convention,quality,notes")
RUNS_ROW = {"id": "r1", "source": "paper", "model": "GPT-1.7B", "arch": "dense", "n_layers": "24", "hidden": "2304",
            "ffn_hidden": "9216", "n_heads": "24", "n_kv_heads": "24", "vocab": "51200", "seq_len": "2048",
            "global_batch": "512", "micro_batch": "16", "gpu": "a100-80gb", "n_gpus": "32", "gpus_per_node": "8",
            "tp": "1", "pp": "1", "dp": "32", "cp": "1", "ep": "1", "vpp": "1", "zero": "0", "recompute": "full",
            "sp": "0", "precision": "fp16", "framework": "megatron-lm", "framework_version": "2021",
            "step_time_s": "3.52802", "step_time_basis": "derived_tflops", "reported_metric": "tflops_per_gpu",
            "reported_value": "137", "quality": "A", "notes": "fp16 mixed precision"}
SERVE_HEADER = ("id,source,url_or_repo_path,model,model_key,gpu,gpu_key,n_gpus,tp,pp,dp,ep,precision,framework,"
                "input_len,output_len,concurrency,batch,metric,value,unit,notes")
SERVE_ROW = {"id": "s1", "source": "TensorRT-LLM perf-overview", "model": "Llama-3.1-8B", "model_key": "llama3.1-8b",
             "gpu": "H200", "gpu_key": "h200", "n_gpus": "1", "tp": "1", "pp": "1", "dp": "1", "ep": "1",
             "precision": "fp8", "framework": "TensorRT-LLM 0.17 (trtllm-bench, TRT engine flow)", "input_len": "128",
             "output_len": "128", "concurrency": "max (offline)", "metric": "output_tokens_per_s",
             "value": "29526.04", "unit": "tokens/s"}
PLAN = ('model = "llama3-8b"\ngpus = "8xh100-sxm"\n\n[plan]\nglobal_batch = 64\nseq_len = 4096\nmicro_batch = 2\n'
        "dp = 8\nzero = 3\n")
SERVE = ["serve", "--model", "llama3-8b", "--gpus", "8xh100-sxm", "--output-len", "128"]


def csv_text(header: str, row: dict, **cells) -> str:
    """One CSV row under ``header`` (its cells by column name; ``cells`` replace the row's)."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow([(row | cells).get(k, "") for k in header.split(",")])
    return header + "\n" + buf.getvalue()


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def fails(argv: list[str], needle: str, capsys) -> str:
    """``main(argv)`` exits 2 with one error line holding ``needle``, no traceback."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err, err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return err


# ---------------------------------------------------------------- 1. length files are read strictly
def test_length_file_with_a_bom_keeps_its_first_line(tmp_path):
    from meshplan.cli.serve import lengths

    path = write(tmp_path, "l.txt", BOM + "1024,1\n2048,3\n")
    assert lengths("--input-len", path) == ((1024, 1.0), (2048, 3.0))


def test_length_file_allows_header_comments_blanks_and_indentation(tmp_path):
    from meshplan.cli.serve import lengths

    path = write(tmp_path, "l.txt", "# lengths\n\nlength,weight\n  1024 , 1 \r\n# more\n2048:3\n\n")
    assert lengths("--input-len", path) == ((1024, 1.0), (2048, 3.0))


def test_length_file_json_list_still_works(tmp_path):
    from meshplan.cli.serve import lengths

    assert lengths("--input-len", write(tmp_path, "l.json", "[[128, 3], [512, 1]]")) == ((128, 3.0), (512, 1.0))


def test_length_counts_and_ranges_as_the_csvs_write_them(capsys):
    """--input-len takes what a validation CSV's length cell takes: 1k, 1,024, a uniform range 512-1536."""
    from meshplan.cli.serve import lengths

    assert lengths("--input-len", "1k") == lengths("--input-len", "1,024") == ((1024, 1.0),)
    assert len(lengths("--input-len", "512-1536")) == 8
    fails([*SERVE, "--input-len", "1536-512"], "--input-len = '1536-512': expected a whole number", capsys)
    fails([*SERVE, "--input-len", "~" + "9" * 400], "--input-len", capsys)
    fails([*SERVE, "--input-len", "9" * 400], "--input-len", capsys)
    fails([*SERVE, "--input-len", "9" * 400 + ":1"], "--input-len", capsys)
    # a spelling a dataset's prefix takes is that dataset, as in the validation CSVs
    assert lengths("--output-len", "ShareGPT_V3") == lengths("--output-len", "sharegpt")


@pytest.mark.parametrize("text, needle", [
    ("1024,1\n-5,1\n2048,1\n", "line 2 = '-5,1': the length '-5' must be a whole number"),
    ("1024,1\nfoo bar\n2048,1\n", "line 2 = 'foo bar': expected length,weight"),
    ("-5,1\n1024,1\n", "line 1 = '-5,1'"),
    ("length,weight\nlen2,w\n1024,1\n", "line 2 = 'len2,w'"),
    ("1e3,1\n", "the length '1e3' must be a whole number"),
    ("1024,0\n", "line 1 = '1024,0': the weight '0' must be a finite number > 0"),
    ("1024,nan\n", "the weight 'nan'"),
    ("1024,1,5\n", "expected length,weight"),
    ("", "has no length,weight lines"),
    ("# only a comment\nlength,weight\n\n", "has no length,weight lines"),
])
def test_length_file_bad_line_is_named(tmp_path, capsys, text, needle):
    path = write(tmp_path, "l.txt", text)
    err = fails([*SERVE, "--input-len", path], needle, capsys)
    assert "--input-len" in err and "l.txt" in err


# ---------------------------------------------------------------- 2. a blank --checkpoint is refused up front
def test_blank_checkpoint_is_refused_before_the_search(tmp_path, capsys):
    out = tmp_path / "exp"
    fails([*SERVE, "--input-len", "1024", "--export", str(out), "--checkpoint", "  "],
          "--checkpoint = '  ': is blank", capsys)
    assert not out.exists()


# ---------------------------------------------------------------- 3. duplicated header columns, long rows
def test_runs_csv_naming_a_column_twice_is_refused(tmp_path, capsys):
    text = csv_text(RUNS_HEADER, RUNS_ROW).splitlines()
    path = write(tmp_path, "r.csv", text[0] + ",step_time_s\n" + text[1] + ",99\n")
    fails(["validate", path], "names column 'step_time_s' twice", capsys)


def test_runs_csv_duplicate_replacing_a_required_column_names_the_duplicate(tmp_path, capsys):
    path = write(tmp_path, "r.csv", csv_text(RUNS_HEADER.replace(",pp,", ",tp,"), RUNS_ROW))
    fails(["validate", path], "names column 'tp' twice", capsys)


def test_serving_csv_naming_a_column_twice_is_refused(tmp_path, capsys):
    path = write(tmp_path, "s.csv", csv_text(SERVE_HEADER.replace(",pp,", ",tp,"), SERVE_ROW))
    fails(["validate", path], "names column 'tp' twice", capsys)


def test_runs_row_with_more_cells_than_the_header_is_skipped(tmp_path, capsys):
    """A header that does not end with the free-text notes: a longer row is skipped, named."""
    header = "notes," + RUNS_HEADER.removesuffix(",notes")
    good = csv_text(header, RUNS_ROW)
    bad = csv_text(header, RUNS_ROW, id="r2").splitlines()[1] + ",x,y\n"
    assert main(["validate", write(tmp_path, "r.csv", good + bad)]) == 0
    out = capsys.readouterr().out
    assert "skipped r2: r2.cells = 41: line 3 has more cells than the 39 columns" in out
    assert "skipped 1" in out


def test_an_unquoted_comma_in_the_notes_stays_in_the_notes(tmp_path, capsys):
    """The notes column last (as the datasets have it): cells beyond the header are the notes' own text."""
    row = csv_text(RUNS_HEADER, RUNS_ROW).rstrip("\n") + ", full activation recompute\n"
    assert main(["validate", write(tmp_path, "r.csv", row), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n"] == 1 and not out["skipped"]


def test_serving_row_with_more_cells_is_skipped(tmp_path):
    """As for runs: skipped where the notes are not the last column, their own text where they are."""
    from meshplan.calibrate.serve_validate import validate_serving_csv

    header = "notes," + SERVE_HEADER.removesuffix(",notes")
    good = csv_text(header, SERVE_ROW)
    bad = csv_text(header, SERVE_ROW, id="s2").splitlines()[1] + ",extra\n"
    report = validate_serving_csv(write(tmp_path, "s.csv", good + bad))
    assert [r.id for r in report.rows] == ["s1"]
    assert report.skipped[0][0] == "s2" and "s2.cells = 23" in report.skipped[0][1]
    plain = csv_text(SERVE_HEADER, SERVE_ROW) + csv_text(SERVE_HEADER, SERVE_ROW, id="s2").splitlines()[1] + ",more\n"
    assert [r.id for r in validate_serving_csv(write(tmp_path, "t.csv", plain)).rows] == ["s1", "s2"]


# ---------------------------------------------------------------- 4. only ep errors are relabelled ep
def test_serving_row_bad_precision_keeps_its_field(tmp_path, capsys):
    path = write(tmp_path, "s.csv", csv_text(SERVE_HEADER, SERVE_ROW, precision="fp7"))
    err = fails(["validate", path], "s1.precision = 'fp7': must be one of", capsys)
    assert ".ep =" not in err


def test_serving_row_plan_relabels_only_ep():
    from meshplan import catalog
    from meshplan.calibrate.serve_validate import row_plan

    engine = catalog.engine("vllm")
    with pytest.raises(SpecError) as info:
        row_plan(SERVE_ROW | {"precision": "fp7"}, engine)
    assert info.value.field == "s1.precision" and info.value.value == "fp7"
    with pytest.raises(SpecError) as info:
        row_plan(SERVE_ROW | {"tp": "0"}, engine)
    assert info.value.field == "s1.tp"
    with pytest.raises(SpecError) as info:
        row_plan(SERVE_ROW | {"tp": "2", "ep": "3"}, engine)
    assert info.value.field == "s1.ep" and "(tp=2, pp=1)" in str(info.value)


# ---------------------------------------------------------------- 5. runs row errors: ROWID.COLUMN = VALUE
@pytest.mark.parametrize("cells, needle", [
    ({"tp": ""}, "r1.tp = '': is empty: a required column"),
    ({"tp": "", "pp": ""}, "r1.tp = '': is empty: a required column (also empty: pp)"),
    ({"step_time_s": "-3.0"}, "r1.step_time_s = '-3.0': the measured step_time_s must be a positive number"),
    ({"step_time_s": "abc"}, "r1.step_time_s = 'abc': must be a number"),
    ({"tp": "3", "dp": "32"}, "r1.layout = 'tp=3 pp=1 dp=32 cp=1 ep=1 vpp=1': "),
    ({"tp": "1.5"}, "r1.tp = '1.5': must be a whole number"),
    ({"gpu": "a100-8gb"}, "r1.gpu = 'a100-8gb': unknown gpu"),
])
def test_runs_row_errors_name_row_and_column(tmp_path, capsys, cells, needle):
    fails(["validate", write(tmp_path, "r.csv", csv_text(RUNS_HEADER, RUNS_ROW, **cells))], needle, capsys)


# ---------------------------------------------------------------- 6. huge values are cut in the error line
def test_spec_error_cuts_a_huge_value_but_keeps_it():
    value = {"k": "x" * 100_000}
    exc = SpecError("f", value, "bad")
    assert len(str(exc)) < 400 and "... (100,009 characters): bad" in str(exc)
    assert exc.value is value
    assert str(SpecError("f", 10**5000, "bad")).startswith("f = <a whole number of more than")


def test_a_huge_file_table_makes_a_short_error_line(tmp_path, capsys):
    path = write(tmp_path, "t.json", json.dumps({"traceEvents": [{"ph": "M", "name": "x" * 50}] * 2000}))
    err = fails(["estimate", "--plan", path], "traceEvents", capsys)
    assert len(err) < 1000


# ---------------------------------------------------------------- 7. byte-order marks
def test_plan_file_with_a_bom_is_read(tmp_path, capsys):
    assert main(["estimate", "--plan", write(tmp_path, "p.toml", BOM + PLAN), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["dp"] == 8


def test_cluster_and_json_files_with_a_bom_are_read(tmp_path):
    from meshplan import catalog
    from meshplan.spec.io import read_file

    cluster = write(tmp_path, "c.toml", BOM + '[[pools]]\ngpu = "h100-sxm"\nn_gpus = 8\n')
    assert catalog.cluster(cluster).n_gpus == 8
    assert read_file(write(tmp_path, "c.json", BOM + '{"a": 1}')) == {"a": 1}


def test_runs_csv_with_a_bom_is_read(tmp_path, capsys):
    assert main(["validate", write(tmp_path, "r.csv", BOM + csv_text(RUNS_HEADER, RUNS_ROW))]) == 0
    assert "n=1 " in capsys.readouterr().out


def test_serving_csv_with_a_bom_is_read(tmp_path, capsys):
    assert main(["validate", write(tmp_path, "s.csv", BOM + csv_text(SERVE_HEADER, SERVE_ROW))]) == 0
    assert "predicted 1 rows" in capsys.readouterr().out


# ---------------------------------------------------------------- 8. empty paths and folders
def test_validate_folder_says_folder(tmp_path, capsys):
    fails(["validate", str(tmp_path)], "is a folder; give a CSV file", capsys)


def test_validate_empty_path_says_empty(capsys):
    fails(["validate", ""], "file = '': is empty: name a CSV file", capsys)


def test_replan_from_empty_path_says_empty(capsys):
    fails(["replan", "--from", "", "--lose", "2"], "file = '': is empty", capsys)


def test_report_output_empty_says_empty(tmp_path, capsys):
    fails(["report", write(tmp_path, "p.toml", PLAN), "-o", ""], "--output = '': is empty", capsys)


def test_load_runs_checks_its_path(tmp_path):
    from meshplan.calibrate.runs import load_runs

    with pytest.raises(SpecError, match="is empty"):
        load_runs("")
    with pytest.raises(SpecError, match="is a folder"):
        load_runs(tmp_path)


# ---------------------------------------------------------------- 9. a gpu cell with blanks around it
def test_runs_gpu_cell_is_stripped(tmp_path, capsys):
    assert main(["validate", write(tmp_path, "r.csv", csv_text(RUNS_HEADER, RUNS_ROW, gpu="a100-80gb "))]) == 0
    assert "skipped 0" in capsys.readouterr().out


# ---------------------------------------------------------------- 10. a plan file's [predicted] table
@pytest.mark.parametrize("table, needle", [
    ("bogus = 1\n", "predicted.bogus = 1: unknown key; allowed: max_memory_fraction, peak_memory_gib, "
                    "step_time_s, switch_s"),
    ("step_time_s = -1\n", "predicted.step_time_s = -1: must be a finite number > 0"),
    ("step_time_s = 0\n", "predicted.step_time_s = 0: must be a finite number > 0"),
    ("peak_memory_gib = -2.5\n", "predicted.peak_memory_gib = -2.5"),
])
def test_plan_file_predicted_table_is_checked(tmp_path, capsys, table, needle):
    fails(["estimate", "--plan", write(tmp_path, "p.toml", PLAN + "\n[predicted]\n" + table)], needle, capsys)


def test_plan_out_predicted_table_reads_back(tmp_path, capsys):
    out = tmp_path / "w.toml"
    assert main(["plan", "--model", "llama3-8b", "--gpus", "8xh100-sxm", "--global-batch", "64", "--seq-len",
                 "4096", "--top", "1", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["estimate", "--plan", str(out), "--json"]) == 0


# ---------------------------------------------------------------- 11. GPU counts are capped
@pytest.mark.parametrize("argv, needle", [
    (["estimate", "--model", "llama3-8b", "--gpus", "1000000000000000000000000000000xh100-sxm",
      "--global-batch", "64", "--seq-len", "4096"], "GPUs cannot all be used: meshplan models at most 1,000,000"),
    (["estimate", "--model", "llama3-8b", "--gpus", "8xh100-sxm+" + "9" * 60 + "xserver",
      "--global-batch", "64", "--seq-len", "4096"], "more than 10^40 CPU servers cannot all be used"),
])
def test_huge_gpu_counts_are_refused(argv, needle, capsys):
    fails(argv, needle, capsys)


def test_replan_add_huge_count_is_refused(tmp_path, capsys):
    plan = write(tmp_path, "w.toml", PLAN)
    fails(["replan", "--from", plan, "--add", "1000000000000000000000000000000xh100-sxm"],
          "--add = '1000000000000000000000000000000xh100-sxm': 1,000,000,000,000,000,000,000,000,000,000 GPUs "
          "cannot all be used", capsys)


def test_cluster_file_huge_pool_is_refused(tmp_path):
    from meshplan import catalog

    path = write(tmp_path, "c.toml", '[[pools]]\ngpu = "h100-sxm"\nn_gpus = 2000000\n')
    with pytest.raises(SpecError, match=r"pools\[0\]\.n_gpus = 2000000: 2,000,000 GPUs cannot all be used"):
        catalog.cluster(path)


def test_a_million_gpus_still_parse():
    from meshplan import catalog
    from meshplan.spec.io import parse_gpus

    assert parse_gpus("1000000xh100-sxm", catalog.gpu).n_gpus == 1_000_000


# ---------------------------------------------------------------- 12. a zero peak names the field
def test_gpu_with_zero_peak_names_the_field(tmp_path, capsys):
    path = write(tmp_path, "c.toml", '[[pools]]\nn_gpus = 8\n[pools.gpu]\nname = "x"\ngeneration = "hopper"\n'
                 "hbm_gb = 80\nhbm_tb_s = 3.35\nnvlink_gb_s = 900\nnic_gbit_s = 400\n[pools.gpu.peak_tflops]\n"
                 "bf16 = 0\n")
    err = fails(["plan", "--model", "llama3-8b", "--cluster", path, "--global-batch", "64", "--seq-len", "4096"],
                "pools[0].gpu.peak_tflops.bf16 = 0: needs a positive dense bf16 or fp32 peak", capsys)
    assert "PeakFlops(" not in err
