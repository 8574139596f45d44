"""meshplan validate against the visible published runs: the bounds of the core issue."""

from meshplan.calibrate.validate import validate_csv

# Rows whose error exceeds 30 % and why; each is a known limitation of the model, reported, not hidden.
KNOWN_MISSES = {
    "narayanan21-t2-174p6b-zero3-768g": "DeepSpeed ZeRO-3 (2021) gathers per parameter at 768 GPUs; the model "
                                        "assumes NCCL rail-aligned, per-layer gathers",
    "narayanan21-t2-174p6b-zero3-1536g": "same as the 768-GPU ZeRO-3 row",
    "narayanan21-t2-529p6b-zero3-640g": "same as the 768-GPU ZeRO-3 row",
    "mbridge2511-deepseek-v3-b200-256g": "-32 % with its MTP module, the recipe's pipeline layout and its mla_up_proj "
                                         "recompute modelled; the rest (MXFP8 at 12 % of fp8 peak; GB200's MXFP8 "
                                         "DeepSeek-V3 runs only 1.28x its bf16 one) has no sourced mechanism yet: "
                                         "TE's MXFP8 quantization reads once and writes two 1-byte copies, no more "
                                         "traffic than current scaling's two reads and one write on Blackwell",
}


def test_every_row_is_predicted_or_skipped_with_a_reason(runs_csv):
    report = validate_csv(runs_csv)
    assert len(report.rows) + len(report.skipped) == 94
    assert all(reason for _, reason in report.skipped)
    assert not report.skipped


def test_accuracy_bounds(runs_csv):
    report = validate_csv(runs_csv)
    assert report.mape <= 10.0, f"MAPE {report.mape:.1f} %"
    assert report.median_ape <= 7.0, f"median {report.median_ape:.1f} %"
    worst = {r.id: r.error_pct for r in report.rows if abs(r.error_pct) > 30.0}
    assert set(worst) <= set(KNOWN_MISSES), f"new rows worse than 30 %: {set(worst) - set(KNOWN_MISSES)}"


def test_json_shape(runs_csv):
    d = validate_csv(runs_csv).as_dict()
    assert set(d) == {"rows", "n", "mape_pct", "median_ape_pct", "max_ape_pct", "skipped"}
    assert set(d["rows"][0]) == {"id", "measured_s", "predicted_s", "error_pct"}


def test_simulator_is_no_worse_than_closed_form_on_interleaved_runs(runs_csv):
    # The schedule issue: on the visible runs that interleave, the simulated pipeline is no worse than the closed
    # form (within 0.1 percentage point of MAPE: the two agree to a fraction of a percent on these runs).
    closed = {r.id: r for r in validate_csv(runs_csv).rows}
    sim = {r.id: r for r in validate_csv(runs_csv, simulate=True).rows}
    from meshplan.calibrate.runs import load_runs

    runs, _ = load_runs(runs_csv)
    ids = [r.id for r in runs if r.plan.vpp > 1]
    assert len(ids) >= 40
    mape_closed = sum(abs(closed[i].error_pct) for i in ids) / len(ids)
    mape_sim = sum(abs(sim[i].error_pct) for i in ids) / len(ids)
    assert mape_sim <= mape_closed + 0.1
    for i in ids:
        assert abs(sim[i].predicted_s / closed[i].predicted_s - 1) < 0.02
