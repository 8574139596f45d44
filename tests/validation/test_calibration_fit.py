"""The fitted constants: where each run's constants come from, and that the shipped table is the script's output."""

import tomllib
from importlib import resources

import pytest

from meshplan.calibrate.fit import SCHEMES, fit, sections_of
from meshplan.calibrate.runs import load_runs
from meshplan.cost.calib import calibration_for


@pytest.fixture(scope="module")
def runs(runs_csv):
    return load_runs(str(runs_csv))[0]


def _by_id(runs, prefix):
    return next(r for r in runs if r.id.startswith(prefix))


def test_sections_under_each_scheme(runs):
    part_row = _by_id(runs, "tt2412-")  # torchtitan on Meta's HBM2e H100
    megatron_h100 = _by_id(runs, "dgxc-")
    assert [(s.key, s.fields) for s in sections_of(part_row, scheme="part")] == [
        (("h100-hbm2e-96gb",), ("gemm_eff", "fp8_eff", "attn_eff"))]
    assert [(s.key, s.fields, s.parent) for s in sections_of(part_row, scheme="library")] == [
        (("hopper", "pytorch"), ("attn_eff",), ("hopper",)),
        (("h100-hbm2e-96gb",), ("gemm_eff", "fp8_eff"), ("hopper",))]
    assert sections_of(part_row, scheme="generation") == []
    assert all(sections_of(megatron_h100, scheme=s) == [] for s in SCHEMES)
    with pytest.raises(ValueError, match="expected one of part, library, generation"):
        sections_of(part_row, scheme="per-row")


def test_library_sub_table_sits_between_generation_and_part():
    table = {"hopper": {"attn_eff": 0.3, "gemm_eff": 0.7, "pytorch": {"attn_eff": 0.25}},
             "h100-hbm2e-96gb": {"gemm_eff": 0.6}}
    assert calibration_for("h100-sxm", "hopper", table).attn_eff == 0.3
    assert calibration_for("h100-sxm", "hopper", table, library="pytorch").attn_eff == 0.25
    part = calibration_for("h100-hbm2e-96gb", "hopper", table, library="pytorch")
    assert (part.gemm_eff, part.attn_eff) == (0.6, 0.25)


def test_flash_attention_2_on_hopper_scales_the_cudnn_attention_constant():
    # Shah et al. 2024 (FlashAttention-3) Fig. 5-6, H100 SXM5, head dim 128, 16k: FA2 370/595 of cuDNN forward,
    # 322/516 backward; torch SDPA's flash backend is FA2. Not on Ampere, not when measured on the device.
    table = {"hopper": {"attn_eff": 0.4}, "ampere": {"attn_eff": 0.5}}
    fa2 = calibration_for("h100-sxm", "hopper", table, library="pytorch").attn_eff
    assert fa2 == pytest.approx(0.4 * 0.62) and 0.62 == pytest.approx(370 / 595, abs=0.005) \
        == pytest.approx(322 / 516, abs=0.005)
    assert calibration_for("h100-sxm", "hopper", table, library="nvidia").attn_eff == 0.4
    assert calibration_for("a100-80gb", "ampere", table, library="pytorch").attn_eff == 0.5
    measured = calibration_for("h100-sxm", "hopper", table, (("attn_eff", 0.3),), library="pytorch")
    assert measured.attn_eff == 0.3


def test_shipped_constants_are_the_fit_of_the_visible_runs(runs):
    # constants.toml is written by scripts/fit_calibration.py, never by hand: refitting reproduces it.
    shipped = tomllib.loads(resources.files("meshplan.calibrate").joinpath("constants.toml").read_text())
    assert fit(runs) == shipped


def test_a_generation_without_runs_gets_the_run_weighted_mean_of_the_fitted_ones():
    """Geometric mean weighted by the runs that inform each constant: three hopper runs (two in fp8) and one
    ampere run; fp8 comes from the fp8 runs only. A GPU of an unfitted generation reads it through the table's
    default section, a fitted generation keeps its own."""
    import math
    from types import SimpleNamespace

    from meshplan.calibrate.fit import unseen_generation

    def run(precision):
        return SimpleNamespace(plan=SimpleNamespace(precision=precision))

    gens = {"hopper": [run("bf16"), run("fp8"), run("fp8")], "ampere": [run("bf16")]}
    table = {"hopper": {"gemm_eff": 0.6, "fp8_eff": 0.5, "attn_eff": 0.4}, "ampere": {"gemm_eff": 0.8}}
    out = unseen_generation(table, gens)
    assert out["gemm_eff"] == pytest.approx(math.exp((3 * math.log(0.6) + math.log(0.8)) / 4), abs=1e-4)
    assert out["fp8_eff"] == 0.5 and out["attn_eff"] == 0.4
    table["default"] = out
    assert calibration_for("mi300x", "cdna3", table).gemm_eff == out["gemm_eff"]
    assert calibration_for("a100-80gb", "ampere", table).gemm_eff == 0.8
