"""Exports that launch the model they name: the model-defining flags of Llama 3/3.1, Mixtral, Qwen2.5 and
DeepSeek-V3 (with its MTP module) per framework, and megatron-core building its config from them."""

from __future__ import annotations

import tomllib

import pytest
from test_export import MEGATRON, bash_array, flag_model, flag_values, heredoc_json
from test_export_parsers import MDS_OPTIONS, _check_megatron_core, flags

from meshplan import catalog
from meshplan.export.base import get_exporter, render_export
from meshplan.export.megatron import megatron_args
from meshplan.spec.plan import Plan


def megatron_words(model, plan, stack=MEGATRON) -> list[str]:
    return sum(([f] if v is None else [f, str(v)] for f, v in megatron_args(model, plan, stack)[0]), [])


# The flags that make Megatron build the model the catalog names (values from each model's config.json, cited in
# its catalog file); a tp=4 plan, so the vocabulary divisor is vocab / 4 and the padded vocabulary exactly vocab.
MODEL_FLAGS = {
    "llama3-70b": {"--rotary-base": "500000", "--norm-epsilon": "1e-05", "--make-vocab-size-divisible-by": "32064"},
    "llama3.1-405b": {"--rotary-base": "500000", "--use-rope-scaling": None, "--rope-scaling-factor": "8"},
    "mixtral-8x7b": {"--rotary-base": "1000000", "--moe-router-score-function": "softmax",
                     "--moe-router-load-balancing-type": "aux_loss", "--moe-aux-loss-coeff": "0.02",
                     "--make-vocab-size-divisible-by": "8000"},
    "qwen2.5-7b": {"--rotary-base": "1000000", "--disable-bias-linear": None, "--add-qkv-bias": None,
                   "--norm-epsilon": "1e-06", "--make-vocab-size-divisible-by": "38016"},
    "deepseek-v3+mtp": {"--rotary-base": "10000", "--rope-type": "yarn", "--rotary-scaling-factor": "40",
                        "--mscale": "1.0", "--mscale-all-dim": "1.0", "--qk-layernorm": None, "--norm-epsilon": "1e-06",
                        "--moe-router-score-function": "sigmoid", "--moe-router-enable-expert-bias": None,
                        "--moe-router-bias-update-rate": "0.001", "--moe-router-topk-scaling-factor": "2.5",
                        "--moe-router-num-groups": "8", "--moe-router-group-topk": "4",
                        "--moe-router-load-balancing-type": "seq_aux_loss", "--moe-aux-loss-coeff": "0.0001",
                        "--mtp-num-layers": "1", "--num-layers": "61", "--make-vocab-size-divisible-by": "32320"},
}
MODEL_PLAN = Plan(global_batch=64, seq_len=4096, tp=4, sp=True, dp=2, ep=2, zero=1)


def plan_for(model):
    return MODEL_PLAN if model.is_moe else MODEL_PLAN.with_(ep=1)


@pytest.mark.parametrize("name", MODEL_FLAGS)
def test_megatron_model_defining_flags(name):
    model = flag_model(name)
    flags = flag_values(megatron_words(model, plan_for(model)))
    assert {k: flags.get(k, "missing") for k in MODEL_FLAGS[name]} == MODEL_FLAGS[name]
    assert flags["--attention-dropout"] == flags["--hidden-dropout"] == "0.0"  # Megatron's defaults are 0.1
    assert ("--use-rope-scaling" in flags) == (model.rope_scaling == "llama3")
    assert ("--add-qkv-bias" in flags) == name.startswith("qwen2.5")


def test_torchtitan_fp8_expert_gemms():
    # 0.2.2: Float8GroupedMMConverter on "experts" where it runs (pp = cp = 1), else the expert GEMMs stay bf16 and
    # the export says so; 0.3.0: Float8GroupedExpertsConverter, as in its deepseek_v3_671b_float8 config.
    model, stack, exp = catalog.model("deepseek-v3"), catalog.framework("torchtitan"), get_exporter("torchtitan")
    flat = Plan(global_batch=64, seq_len=4096, dp=64, ep=8, zero=3, precision="fp8", framework="torchtitan")
    res = render_export(exp, model, flat, stack)
    doc = tomllib.loads(res.text)
    assert doc["model"]["converters"] == ["quantize.linear.float8", "quantize.grouped_mm.float8"]
    assert doc["quantize"]["grouped_mm"]["float8"]["fqns"] == ["experts"]
    assert doc["quantize"]["linear"]["float8"]["filter_fqns"] == ["output", "router.gate"]
    assert not any("stay bf16" in n for n in res.approximations)
    piped = render_export(exp, model, flat.with_(pp=4, dp=16), stack)
    assert "grouped_mm" not in tomllib.loads(piped.text)["quantize"]
    assert any("stay bf16" in n for n in piped.approximations)
    py = render_export(exp, model, flat, stack, fmt="python").text
    assert "Float8GroupedExpertsConverter.Config(model_compile_enabled=False)" in py and "'router.gate'" in py


@pytest.mark.parametrize("name", MODEL_FLAGS)
def test_model_defining_flags_build_megatron_core_config(name):
    _check_megatron_core(megatron_words(flag_model(name), plan_for(flag_model(name))))


@pytest.mark.parametrize("name", MODEL_FLAGS)
def test_megatron_deepspeed_model_flags(name):
    # examples_deepspeed/pretrain_llama2_distributed.sh's "required for llama model" flags, the RoPE base, and
    # what Megatron-DeepSpeed cannot build said instead of dropped
    model = flag_model(name)
    res = render_export(get_exporter("deepspeed"), model, plan_for(model), MEGATRON)
    words = bash_array(res.text, "MDS_ARGS")
    got = flag_values(words)
    assert not set(flags(words)) - MDS_OPTIONS
    assert {"--no-query-key-layer-scaling", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
            "--use-rotary-position-embeddings"} <= set(got)
    assert got["--attention-dropout"] == got["--hidden-dropout"] == "0.0"
    assert got["--rotary-position-embeddings-theta"] == MODEL_FLAGS[name]["--rotary-base"]
    assert got["--make-vocab-size-divisible-by"] == str(model.vocab // 4)
    said = " ".join(res.approximations)
    assert ("q/k/v biases" in said) == model.decoder.attention.qkv_bias
    assert ("RoPE scaling" in said) == (model.rope_scaling != "none")
    assert ("multi-token-prediction" in said) == name.endswith("+mtp")
    if model.is_moe:
        assert got["--moe-loss-coeff"] == str(model.decoder.moe.aux_loss_coeff) and "--create-moe-param-group" in got
        assert ("router:" in said) == (model.decoder.moe.router_score == "sigmoid")
    assert heredoc_json(res.text)["train_batch_size"] == 64


@pytest.mark.parametrize("name", MODEL_FLAGS)
def test_torchtitan_says_when_its_flavor_is_another_model(name):
    # torchtitan's llama3 flavors are Llama 3.1 (RoPE scaling x8), its deepseek_v3 671B has no MTP module in 0.2
    model = flag_model(name)
    res = render_export(get_exporter("torchtitan"), model, plan_for(model), catalog.framework("torchtitan"))
    said = " ".join(res.approximations)
    assert ("RoPE: torchtitan's" in said) == (name == "llama3-70b")
    assert ("ships no flavor" in said) == (name in ("mixtral-8x7b", "qwen2.5-7b"))
    assert ("multi-token-prediction" in said) == name.endswith("+mtp")
    assert tomllib.loads(res.text)["model"]["name"] == ("deepseek_v3" if model.is_moe else "llama3")
