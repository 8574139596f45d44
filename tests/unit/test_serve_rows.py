"""Reading a published serving row: the engine (family and version), the load (clients, a rate, offline), a named
dataset's lengths; and the open-loop physics those rows exercise (an arrival below the cap waits only for the
prefill queue; multi-step scheduling makes it wait half a round)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from meshplan import catalog
from meshplan.calibrate.serve_cells import row_load
from meshplan.calibrate.serve_constants import load_constants
from meshplan.calibrate.serve_validate import reported, row_workload
from meshplan.cost.serve_load import predict_load
from meshplan.cost.serve_step import step_context
from meshplan.cost.serve_tail import quantile
from meshplan.errors import SpecError
from meshplan.spec.serving import ServePlan, Workload


def row(**kw):
    base = {"id": "r", "concurrency": "", "notes": "", "input_len": "128", "output_len": "64"}
    return base | kw


@pytest.mark.parametrize("conc, notes, load", [
    ("16", "", {"concurrency": 16}),
    ("max (offline)", "", {}),
    ("inf (offline, 5000 prompts)", "", {}),
    ("4 qps", "", {"rate": 4.0}),
    ("2.5 req/s", "", {"rate": 2.5}),
    ("", "online, request rate 8/s, 2400 prompts", {"rate": 8.0}),
    ("", "offline (request rate inf), 5000 prompts", {}),
    # spellings other sources use
    ("64 (closed loop)", "", {"concurrency": 64}),
    ("64.0", "", {"concurrency": 64}),
    ("10 req/s (Poisson)", "", {"rate": 10.0}),
    ("qps=4", "", {"rate": 4.0}),
    ("rate 4/s", "", {"rate": 4.0}),
    ("unlimited", "", {}),
    ("", "QPS 4, Poisson arrivals", {"rate": 4.0}),
    ("", "vllm bench serve --request-rate 4", {"rate": 4.0}),
    ("", "Poisson arrivals at 2.5 requests per second", {"rate": 2.5}),
    ("c=64", "", {"concurrency": 64}),
    ("--max-concurrency 64", "", {"concurrency": 64}),
    ("maximum concurrency 64", "", {"concurrency": 64}),
    ("4", "open loop, request rate 4/s", {"rate": 4.0}),  # INFERENCE.md: the column holds an open loop's QPS
    ("4", "Poisson arrivals", {"rate": 4.0}),
    ("offline (max throughput)", "", {}),
    ("Concurrency: 32", "", {"concurrency": 32}),
    ("max-concurrency 16", "", {"concurrency": 16}),
    ("128 concurrent users", "", {"concurrency": 128}),
    ("8 clients (closed loop)", "", {"concurrency": 8}),
])
def test_row_load(conc, notes, load):
    assert row_load(row(concurrency=conc, notes=notes)) == load


@pytest.mark.parametrize("text, name", [
    ("FP8", "fp8"), ("FP8 (W8A8)", "fp8"), ("fp8_e4m3", "fp8"), ("bfloat16", "bf16"), ("BF16 (mixed)", "bf16"),
    ("float16", "fp16"), ("half", "fp16"), ("NVFP4", "nvfp4"), ("int4 (AWQ)", "int4"),
])
def test_precision_spellings(text, name):
    from meshplan.spec.plan import precision_name

    assert precision_name(text) == name


def test_row_load_without_a_rate_names_the_field():
    with pytest.raises(SpecError, match="r.concurrency"):
        row_load(row(concurrency="", notes="server scenario"))


def test_a_named_dataset_gives_its_mean_lengths():
    w = row_workload(row(input_len="ShareGPT (variable)", output_len="ShareGPT (variable)", concurrency="8"))
    share = catalog.dataset("sharegpt")
    assert (w.input_len, w.output_len, w.concurrency) == (share.input_mean, share.output_mean, 8)
    with pytest.raises(SpecError, match="sharegpt"):
        row_workload(row(input_len="LMSYS-Chat (variable)", concurrency="8"))


@pytest.mark.parametrize("text, bins", [
    ("1024", ((1024, 1.0),)), ("1,024", ((1024, 1.0),)), ("1k", ((1024, 1.0),)), ("2K", ((2048, 1.0),)),
    ("~1000", ((1000, 1.0),)), ("1000 tokens", ((1000, 1.0),)), ("512 (fixed)", ((512, 1.0),)),
    ("100-107", tuple((n, 1 / 8) for n in range(100, 108))),
    ("random 1024", ((1024, 1.0),)), ("Random-1K", ((1024, 1.0),)), ("fixed 512", ((512, 1.0),)),
    ("1024.0", ((1024, 1.0),)),
])
def test_length_cells(text, bins):
    from meshplan.calibrate.serve_cells import length_bins

    assert length_bins(text, "r.input_len") == bins


def test_a_range_is_drawn_uniformly():
    """vLLM's random dataset draws lengths uniformly from lo..hi inclusive: 8 equal bins, mean at the midpoint."""
    w = row_workload(row(input_len="512-1536", output_len="128 to 384", rate="", concurrency="4 qps"))
    ins, outs = w.bins("input"), w.bins("output")
    assert len(ins) == len(outs) == 8 and w.rate == 4.0
    assert (w.input_len, w.output_len) == (1024, 256)
    assert ins[0][0] == 576 and ins[-1][0] == 1472  # bin width 128.125, each at its middle
    assert w.longest == 1472 + 368


@pytest.mark.parametrize("text", ["", "lots", "0", "1.5", "300-200", "-5", "1e3", "1,5", "10-10", "0-5", "9" * 400,
                                  "1-" + "9" * 400, "~" + "9" * 30, "2000000000"])
def test_bad_length_cells_name_the_field(text):
    with pytest.raises(SpecError, match="r.input_len"):
        row_workload(row(input_len=text, concurrency="8"))


def test_a_dataset_named_for_the_output_only_needs_the_prompt_too():
    with pytest.raises(SpecError, match="r.input_len"):
        row_workload(row(input_len="1024", output_len="ShareGPT", concurrency="8"))


def ctx_of(engine="sglang", **kw):
    plan = ServePlan(tp=1, engine=engine)
    pool = catalog.cluster("1xh100-sxm").pools[0]
    return step_context(catalog.model("llama3.1-8b"), pool, plan, dataclasses.replace(catalog.engine(engine), **kw)
                        if kw else catalog.engine(engine), load_constants())


def test_light_open_loop_waits_only_for_prefills():
    """Far below capacity an arrival is admitted at once: TTFT is its prefill, half a step and at most an M/D/1
    wait for the prefills ahead (rho_p / (2 (1 - rho_p)) t_p), and it grows with the rate."""
    ctx = ctx_of()
    light, busier = (predict_load(ctx, Workload(input_len=512, output_len=128, rate=r)) for r in (0.5, 4.0))
    for p in (light, busier):
        assert p.resident < p.kv_capacity_tokens and p.queue_wait <= p.prefill
        assert p.ttft == pytest.approx(p.queue_wait + p.prefill + p.decode_step / 2 + ctx.request_s)
    assert light.queue_wait <= busier.queue_wait and light.queue_wait < 0.1 * light.prefill


def test_multi_step_rounds_delay_the_first_token_by_half_a_round():
    """vLLM's multi-step scheduler admits prompts between rounds of n decode steps: (n - 1) t_d / 2 more TTFT;
    offline runs have no arrivals to delay."""
    work = Workload(input_len=512, output_len=128, rate=1.0)
    one = predict_load(ctx_of("vllm-0.6.0", multi_step=1), work)
    ten = predict_load(ctx_of("vllm-0.6.0", multi_step=10), work)
    assert ten.ttft - one.ttft == pytest.approx(9 * ten.decode_step / 2, rel=0.05)
    off = Workload(input_len=512, output_len=128)
    assert predict_load(ctx_of("vllm-0.6.0", multi_step=10), off).ttft == pytest.approx(
        predict_load(ctx_of("vllm-0.6.0", multi_step=1), off).ttft)


def test_a_harness_that_publishes_medians_is_read_at_the_median():
    """The SGLang benchmark's tables are medians (``reports = "median"``): its ITL row reads the median gap, a
    plain decode step while under half of the steps carry a prefill, and its TTFT the median wait; NIM's means
    stay the mean."""
    eng = catalog.engine("sglang-0.3.0")
    assert eng.reports == "median" and catalog.engine("nim-1.8").reports == "mean"
    ctx = ctx_of("sglang-0.3.0")
    pred = predict_load(ctx, Workload(input_len=224, output_len=198, rate=4.0))
    assert 0 < pred.stall_share < 0.5
    assert reported(pred, "itl_ms", eng) == pytest.approx(1e3 * (pred.tpot - pred.stall_share * pred.stall))
    assert reported(pred, "itl_ms", eng) < pred.metric("itl_ms")
    assert reported(pred, "ttft_ms", eng) == pytest.approx(1e3 * quantile(pred, "ttft", 0.5))
    assert reported(pred, "output_tokens_per_s", eng) == pred.metric("output_tokens_per_s")
    assert reported(pred, "itl_ms", catalog.engine("nim-1.8")) == pred.metric("itl_ms")


def test_an_unstated_tp_is_what_the_gpus_leave_over_pp_and_dp():
    from meshplan.calibrate.serve_validate import row_plan

    engine = catalog.engine("vllm")
    base = {"id": "r", "precision": "bf16", "tp": "", "pp": "1", "dp": "2", "ep": "", "n_gpus": "8"}
    assert row_plan(base, engine).tp == 4
    assert row_plan(base | {"n_gpus": ""}, engine).tp == 1  # nothing to infer from
    assert row_plan(base | {"tp": "2"}, engine).tp == 2  # a stated tp is kept


def test_catalog_names_are_read_in_any_case():
    assert catalog.gpu("H100-SXM").name == "h100-sxm" and catalog.model("Qwen3-32B") == catalog.model("qwen3-32b")


@pytest.mark.parametrize("unit, notes, q", [
    ("ms", "", None),
    ("ms", "sglang.bench_serving; medians", 0.5),
    ("ms", "P99 TTFT from the benchmark's summary", 0.99),
    ("ms (p90)", "", 0.9),
    ("ms", "99th percentile latency over 1000 requests", 0.99),
    ("ms", "95th-percentile TTFT", 0.95),
    ("ms", "TTFT (p90) over 5 minutes", 0.9),
    ("ms", "average latency over the run", 0.0),
    ("ms", "mean TTFT; the p99 bound is 2 s", 0.0),  # the bound is not what was measured
    # not a latency's statistic, or a bound on one: the profile's statistic stands
    ("ms", "Mean = LoadGen mean over samples", None),
    ("ms", "this means the server was warm", None),
    ("ms", "average prompt length 224 tokens", None),
    ("ms", "median output length 116", None),
    ("ms", "P99 TTFT < 2 s SLO", None),
    ("ms", "p00 latency", None),
    ("ms", "median TTFT and mean TPOT", 0.5),  # this row is a TTFT: the TPOT's statistic is another row's
    ("ms", "median TTFT, mean TTFT over 3 runs", None),  # two named for it: neither is read
    ("ms", "online, request rate 8/s", None),
])
def test_row_statistic(unit, notes, q):
    from meshplan.calibrate.serve_cells import row_statistic

    assert row_statistic(row(unit=unit, notes=notes, metric="ttft_ms")) == q


def test_a_statistic_named_for_another_metric_is_not_this_rows():
    from meshplan.calibrate.serve_cells import row_statistic

    notes = "median ITL, p99 TTFT"
    assert row_statistic(row(notes=notes, metric="itl_ms")) == 0.5
    assert row_statistic(row(notes=notes, metric="ttft_ms")) == 0.99
    assert row_statistic(row(notes="P99 TTFT over the run", metric="tpot_ms")) is None


@pytest.mark.parametrize("text, fmt", [("FP8 (W8A8)", "fp8"), ("fp16 (AWQ)", "int4"), ("AWQ int4", "int4"),
                                       ("GPTQ-Int4", "int4"), ("W8A8-FP8", "fp8"), ("NVFP4", "fp4"), ("bf16", None)])
def test_the_weight_format_is_read_anywhere_in_the_cell(text, fmt):
    from meshplan.calibrate.serve_cells import weight_format

    assert weight_format(text) == fmt


def test_a_row_that_names_its_percentile_is_read_at_it():
    """ShareGPT's replies vary, so E2E's mean, median and p99 differ; a row's named statistic picks which, over
    the profile's default (vLLM: the mean)."""
    from meshplan.calibrate.serve_validate import _statistic

    eng = catalog.engine("vllm")
    work = catalog.dataset("sharegpt").workload(rate=2.0)
    pred = predict_load(ctx_of("vllm"), work)
    mean, median, p99 = (reported(pred, "e2e_latency_s", eng, q) for q in (None, 0.5, 0.99))
    assert mean == pytest.approx(pred.e2e) and median < mean < p99
    assert p99 == pytest.approx(quantile(pred, "e2e", 0.99))
    assert _statistic((1.0, 2.0, 3.0, 10.0), eng) == 4.0
    assert _statistic((1.0, 2.0, 3.0, 10.0), eng, 0.5) == 2.5
    assert _statistic((1.0, 2.0, 3.0, 10.0), eng, 0.99) == pytest.approx(3.0 + 7.0 * 0.97)


@pytest.mark.parametrize("conc", ["0", "0 qps", "max 64", "max batch 256", "max_num_seqs=256"])
def test_no_load_or_a_cap_is_not_read_as_offline(conc):
    with pytest.raises(SpecError, match="r.concurrency"):
        row_load(row(concurrency=conc))


@pytest.mark.parametrize("text, value", [("1,234.5", 1234.5), ("~120", 120.0), ("120 ms", 120.0), ("1.2e3", 1200.0),
                                         ("120 (median)", 120.0), ("nan", None), ("-3", None), ("12,34", None)])
def test_measured_value_spellings(text, value):
    from meshplan.calibrate.serve_cells import measured_value

    assert measured_value(text) == value


def test_row_gpus_set_the_replicas_and_bound_the_layout():
    from meshplan.calibrate.serve_validate import row_plan

    eng = catalog.engine("sglang")
    # n_gpus over tp x pp with dp unstated: replicas, as an unstated tp is read
    assert row_plan(row(precision="bf16", n_gpus="8", tp="2", pp="", dp=""), eng).replicas == 4
    # SGLang's --tp 8 --dp 8 --enable-dp-attention on 8 GPUs: 8 attention groups of one GPU, experts over all 8
    p = row_plan(row(precision="fp8", n_gpus="8", tp="8", pp="1", dp="8", ep=""), eng)
    assert (p.tp, p.attn_dp, p.ep, p.replicas, p.gpus_per_replica) == (1, 8, 8, 1, 8)
    with pytest.raises(SpecError, match="r.n_gpus"):
        row_plan(row(precision="bf16", n_gpus="4", tp="8", pp="1", dp="1"), eng)


def test_short_lines_and_impossible_layouts_are_skipped_with_reasons(tmp_path):
    """A line with fewer cells than the header, or a tp that does not divide the heads, costs that row only."""
    import csv

    from meshplan.calibrate.serve_validate import validate_serving_csv

    src = Path(__file__).resolve().parents[3] / "shared" / "validation" / "inference_visible.csv"
    if not src.is_file():
        pytest.skip("serving measurements not found")
    rows = list(csv.DictReader(src.open()))[:3]
    path = tmp_path / "s.csv"
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerow(rows[0])
        w.writerow({**rows[1], "id": "bad-tp", "tp": "64", "n_gpus": "64"})
    with path.open("a") as fh:
        fh.write("short-line,src,url,Llama,llama3.1-8b\n")
    report = validate_serving_csv(path)
    reasons = dict(report.skipped)
    assert [r.id for r in report.rows] == [rows[0]["id"]]
    assert "attention heads" in reasons["bad-tp"] and "short-line" in reasons


@pytest.mark.parametrize("cell, value", [("4", 4), ("4.0", 4), ("TP4", 4), ("tp=4", 4), ("TP 4", 4),
                                         ("4 (tensor parallel)", 4), ("n/a", 1), ("-", 1), ("", 1)])
def test_degree_cells_as_sources_write_them(cell, value):
    from meshplan.calibrate.serve_cells import whole_cell

    assert whole_cell(row(tp=cell), "tp", 1) == value


@pytest.mark.parametrize("cell", ["PP2", "4.5", "four", "-1"])
def test_a_degree_labelled_for_another_column_or_not_whole_is_refused(cell):
    from meshplan.calibrate.serve_cells import whole_cell

    with pytest.raises(SpecError, match=r"r\.tp = .*whole number"):
        whole_cell(row(tp=cell), "tp", 1)


def test_a_not_stated_dp_is_read_as_an_empty_one():
    from meshplan.calibrate.serve_validate import row_plan

    eng = catalog.engine("vllm")
    assert row_plan(row(precision="bf16", n_gpus="8", tp="TP2", pp="n/a", dp="n/a"), eng).replicas == 4


def test_a_degree_labelled_for_another_column_in_parentheses_is_refused():
    from meshplan.calibrate.serve_cells import whole_cell

    with pytest.raises(SpecError, match=r"r\.tp = '2 \(PP\)'"):
        whole_cell(row(tp="2 (PP)"), "tp", 1)
    assert whole_cell(row(tp="2 (tensor)"), "tp", 1) == 2


SERVING = Path(__file__).resolve().parents[3] / "shared" / "validation" / "inference_visible.csv"


def first_visible_row() -> dict:
    """The first published serving row (the test skips without the shared data)."""
    import csv

    if not SERVING.is_file():
        pytest.skip("serving measurements not found")
    with SERVING.open(newline="") as fh:
        return next(csv.DictReader(fh))


def written(path: Path, rows: list[dict], delimiter: str = ",") -> Path:
    """``rows`` as a CSV file at ``path``."""
    import csv

    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]), delimiter=delimiter)
        w.writeheader()
        w.writerows(rows)
    return path


def test_key_cells_name_files_or_fall_back_to_the_printed_names(tmp_path):
    """A path in model_key wins over the model column; an overlong or empty key costs its row only."""
    from meshplan.calibrate.serve_validate import validate_serving_csv

    first = first_visible_row()
    small = tmp_path / "small.toml"
    small.write_text((Path(catalog.__file__).parent / "models" / "llama3.1-8b.toml").read_text()
                     .replace("n_layers = 32", "n_layers = 8"))
    report = validate_serving_csv(written(tmp_path / "rows.csv", [
        first, {**first, "id": "file", "model_key": str(small)},
        {**first, "id": "long", "model_key": "x" * 300, "model": "y" * 300},
        {**first, "id": "empty", "model_key": "", "model": ""}]))
    got = {r.id: r.predicted for r in report.rows}
    assert got["file"] > 2 * got[first["id"]]  # a quarter of the layers
    reasons = dict(report.skipped)
    assert "unknown model" in reasons["long"] and "unknown model" in reasons["empty"]


def test_a_semicolon_file_reads_decimal_commas(tmp_path):
    from meshplan.calibrate.serve_validate import validate_serving_csv

    first = first_visible_row()
    path = written(tmp_path / "semi.csv", [{**first, "value": first["value"].replace(".", ",")}], delimiter=";")
    (got,) = validate_serving_csv(path).rows
    assert got.measured == pytest.approx(float(first["value"]))
