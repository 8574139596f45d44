"""Exports read by the frameworks' own configuration parsers, for the golden plans, the README tour's plans and
the models whose defining flags test_export asserts. ``make test`` installs every parser (Makefile ``.extras``):

- Megatron-LM: ``pretrain_gpt.py``'s parser is not on PyPI; its flag names are listed below from
  ``megatron/training/arguments.py``, and every flag that names a megatron-core ``TransformerConfig`` field (how
  core_v0.16's ``ArgumentGroupFactory`` generates them) builds megatron-core 0.16.1's ``(MLA)TransformerConfig``,
  whose ``__post_init__`` validates them; ``PipelineParallelLayerLayout`` parses the layout strings.
- DeepSpeed 0.19.8: ``deepspeed.runtime.config.DeepSpeedConfig`` on the JSON, with the plan's data-parallel size.
- torchtitan 0.2.2: ``torchtitan.config.ConfigManager`` on the TOML (rejects unknown keys); its converter registry
  knows every converter named.
- torchtitan 0.3.0: ``ConfigManager`` on the Python module, in a subprocess on ``.venv/torchtitan3`` (0.3 cannot
  share one environment with 0.2); the float8 converters build on a CPU with their GPU check answered yes.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from test_export import (
    GOLDEN,
    PLANS,
    bash_array,
    flag_model,
    flag_values,
    heredoc_json,
    load,
    refused,
    render,
)

from meshplan import catalog
from meshplan.export.base import ExportError, get_exporter, render_export
from meshplan.export.megatron import megatron_args
from meshplan.spec.plan import Plan

# megatron/training/arguments.py (NVIDIA/Megatron-LM, commit 000c4ac2, and core_v0.16.1 where the transformer
# options come from TransformerConfig's fields): _add_network_size_args, _add_training_args, _add_distributed_args,
# _add_mixed_precision_args, _add_transformer_engine_args, _add_moe_args, _add_mla_args, _add_tokenizer_args,
# _add_data_args, _add_regularization_args (dropout), _add_vision_args (--qk-layernorm sits there)
MEGATRON_OPTIONS = {
    "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--kv-channels",
    "--group-query-attention", "--num-query-groups", "--max-position-embeddings", "--position-embedding-type",
    "--normalization", "--norm-epsilon", "--swiglu", "--squared-relu", "--untie-embeddings-and-output-weights",
    "--disable-bias-linear", "--add-qkv-bias", "--qk-layernorm", "--attention-dropout", "--hidden-dropout",
    "--multi-latent-attention", "--vocab-size", "--make-vocab-size-divisible-by", "--seq-length",
    "--rotary-base", "--rope-type", "--use-rope-scaling", "--rope-scaling-factor", "--rotary-scaling-factor",
    "--mscale", "--mscale-all-dim",
    "--micro-batch-size", "--global-batch-size", "--recompute-granularity", "--recompute-method",
    "--recompute-num-layers", "--sequence-parallel", "--tp-comm-overlap",
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers", "--pipeline-model-parallel-layout",
    "--num-layers-per-virtual-pipeline-stage", "--overlap-grad-reduce", "--overlap-param-gather",
    "--use-distributed-optimizer", "--use-megatron-fsdp", "--data-parallel-sharding-strategy",
    "--num-distributed-optimizer-instances", "--context-parallel-size", "--cp-comm-type",
    "--use-tp-pp-dp-mapping", "--fp16", "--bf16", "--fp8-format",
    "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--num-experts", "--moe-layer-freq",
    "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size", "--moe-grouped-gemm", "--moe-router-topk",
    "--moe-token-dispatcher-type", "--moe-expert-capacity-factor", "--moe-router-score-function",
    "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate", "--moe-router-topk-scaling-factor",
    "--moe-router-num-groups", "--moe-router-group-topk", "--moe-router-load-balancing-type", "--moe-aux-loss-coeff",
    "--mtp-num-layers", "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim",
    "--use-precision-aware-optimizer", "--main-grads-dtype", "--exp-avg-dtype", "--exp-avg-sq-dtype",
    "--recompute-modules", "--grad-reduce-in-bf16", "--fp8-param-gather",
}
MEGATRON_CHOICES = {"--position-embedding-type": {"learned_absolute", "rope", "mrope", "relative", "none"},
                    "--normalization": {"LayerNorm", "RMSNorm"}, "--recompute-granularity": {"full", "selective"},
                    "--recompute-method": {"uniform", "block"}, "--fp8-format": {"e4m3", "hybrid"},
                    "--data-parallel-sharding-strategy": {"no_shard", "optim", "optim_grads",
                                                          "optim_grads_params"},
                    "--moe-token-dispatcher-type": {"allgather", "alltoall", "flex"},
                    "--rope-type": {"rope", "yarn"}, "--moe-router-score-function": {"softmax", "sigmoid"},
                    "--moe-router-load-balancing-type": {"aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn",
                                                         "none"}}

# megatron/arguments.py (microsoft/Megatron-DeepSpeed, commit f4157bea; deepspeedai's 207b2d5a has the same
# names) plus deepspeed.add_config_arguments
MDS_OPTIONS = {
    "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--num-key-value-heads",
    "--kv-channels", "--seq-length", "--max-position-embeddings", "--normalization", "--layernorm-epsilon",
    "--swiglu", "--squared-relu", "--disable-bias-linear", "--use-rotary-position-embeddings",
    "--no-position-embedding", "--rotary-position-embeddings-theta", "--untie-embeddings-and-output-weights",
    "--no-query-key-layer-scaling", "--attention-dropout", "--hidden-dropout", "--vocab-size",
    "--make-vocab-size-divisible-by", "--num-experts", "--topk", "--expert-interval", "--moe-expert-parallel-size",
    "--moe-loss-coeff", "--create-moe-param-group", "--moe-train-capacity-factor", "--disable-moe-token-dropping",
    "--disable-moe-top2-2nd-expert-sampling",
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--no-pipeline-parallel",
    "--sequence-parallel", "--ds-sequence-parallel-size", "--enable-zbh1-pipeline",
    "--micro-batch-size", "--global-batch-size", "--bf16", "--fp16", "--checkpoint-activations",
    "--deepspeed-activation-checkpointing", "--recompute-granularity", "--zero-stage",
    "--deepspeed", "--deepspeed_config", "--use-flash-attn-v2",
}

# DeepSpeed docs config-json and deepspeed/runtime/config.py, zero/config.py, activation_checkpointing/config.py
DS_KEYS = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
           "gradient_clipping", "steps_per_print", "wall_clock_breakdown", "bf16", "fp16", "zero_optimization",
           "activation_checkpointing", "data_types"}
DS_ZERO_KEYS = {"stage", "overlap_comm", "contiguous_gradients", "reduce_scatter", "mics_shard_size"}

# The README tour's plans (meshplan plan ... as its steps 1, 3 and 5 run them)
README_PLANS = {
    "readme-llama3-70b": ["--model", "llama3-70b", "--gpus", "64xh100-sxm", "--global-batch", "128", "--seq-len",
                          "8192", "--precision", "fp8"],
    "readme-llama3-70b-torchtitan": ["--model", "llama3-70b", "--gpus", "64xh100-sxm", "--global-batch", "128",
                                     "--seq-len", "8192", "--precision", "fp8", "--framework", "torchtitan"],
    "readme-tiny-llama": ["--model", "tiny-llama", "--gpus", "2xcpu", "--global-batch", "8", "--seq-len", "64",
                          "--precision", "fp32", "--framework", "meshplan"],
}
CASES = PLANS + sorted(README_PLANS)


@pytest.fixture(scope="module")
def plan_files(tmp_path_factory) -> dict[str, Path]:
    from meshplan.cli import main

    out = {n: GOLDEN / "plans" / f"{n}.toml" for n in PLANS}
    folder = tmp_path_factory.mktemp("readme")
    for name, argv in README_PLANS.items():
        out[name] = folder / f"{name}.toml"
        assert main(["plan", *argv, "--out", str(out[name])]) == 0
    return out


def flags(words: list[str]) -> list[str]:
    return [w for w in words if w.startswith("--")]


# ---------------------------------------------------------------- Megatron-LM
@pytest.mark.parametrize("name", CASES)
def test_megatron_option_names(name, plan_files):
    words = bash_array(render(name, "megatron", path=plan_files[name]).text, "MEGATRON_ARGS")
    assert not set(flags(words)) - MEGATRON_OPTIONS
    for i, w in enumerate(words[:-1]):
        if w in MEGATRON_CHOICES:
            assert words[i + 1] in MEGATRON_CHOICES[w], (w, words[i + 1])


def _megatron_core():
    """megatron-core's transformer_config module, its TE version checks answered yes (they gate kernels, not
    configs); None when megatron-core is missing."""
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        return None
    import megatron.core.transformer.transformer_config as tc

    tc.is_te_min_version = lambda *a, **k: True
    return tc


# flags arguments.py spells apart from the TransformerConfig field (core_v0.16.1 _add_network_size_args exclude
# list and core_transformer_config_from_args)
_RENAMED = {"--num-experts": "num_moe_experts", "--decoder-first-pipeline-num-layers":
            "num_layers_in_first_pipeline_stage", "--decoder-last-pipeline-num-layers":
            "num_layers_in_last_pipeline_stage", "--fp8-format": "fp8"}


def megatron_core_config(words: list[str]):
    """Build megatron-core's config from pretrain_gpt.py flags: each flag that names a field (``--field-name``,
    a bare ``--no-``/``--disable-`` for True defaults, or the field's ``argparse_meta`` names) sets it, as
    core_transformer_config_from_args copies same-named args; ``--swiglu`` and ``--bf16`` as it translates them."""
    import torch
    import torch.nn.functional as F

    tc = _megatron_core()
    values = flag_values(words)
    cls = tc.MLATransformerConfig if "--multi-latent-attention" in values else tc.TransformerConfig
    names = {}
    for f in dataclasses.fields(cls):
        meta = (f.metadata or {}).get("argparse_meta", {})
        dashed = f.name.replace("_", "-")
        for flag in meta.get("arg_names", [f"--{dashed}", f"--no-{dashed}", f"--disable-{dashed}"]):
            names[flag] = f
    kw: dict = {"params_dtype": torch.float32, "pipeline_dtype": torch.float32}
    for flag, value in values.items():
        field = names.get(flag)
        name = _RENAMED.get(flag, field.name if field else None)
        if name is None:
            continue
        if value is None:
            kw[name] = field.default is not True
        elif name == "moe_layer_freq":
            kw[name] = eval(value)  # arguments.py moe_freq_type evaluates the same Python expression
        else:
            try:
                kw[name] = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                kw[name] = value
    if "--swiglu" in values:
        kw |= {"gated_linear_unit": True, "activation_func": F.silu}
    if "--bf16" in values:
        kw |= {"bf16": True, "params_dtype": torch.bfloat16, "pipeline_dtype": torch.bfloat16}
    if isinstance(kw.get("recompute_modules"), str):
        kw["recompute_modules"] = [kw["recompute_modules"]]
    return cls(**kw), kw


def _check_megatron_core(words: list[str]) -> None:
    if _megatron_core() is None:
        pytest.skip("megatron-core is not installed")
    config, kw = megatron_core_config(words)
    for name, value in kw.items():
        if name not in ("moe_layer_freq", "pipeline_model_parallel_layout"):
            assert getattr(config, name) == value, name


@pytest.mark.parametrize("name", CASES)
def test_megatron_args_build_megatron_core_config(name, plan_files):
    _check_megatron_core(bash_array(render(name, "megatron", path=plan_files[name]).text, "MEGATRON_ARGS"))


@pytest.mark.parametrize("name", CASES + ["deepseek-v3+mtp"])
def test_megatron_layout_parsed_by_megatron_core(name, plan_files):
    if _megatron_core() is None:
        pytest.skip("megatron-core is not installed")
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    if name in plan_files:
        plan = load(name, plan_files[name])[1]
        values = flag_values(bash_array(render(name, "megatron", path=plan_files[name]).text, "MEGATRON_ARGS"))
    else:  # uneven stages, the MTP module on the last
        plan = Plan(global_batch=64, seq_len=4096, pp=4, dp=2, ep=2, layer_split=(15, 16, 17, 14))
        args = megatron_args(flag_model(name), plan, catalog.framework("megatron-core"))[0]
        values = dict((f, None if v is None else str(v)) for f, v in args)
        assert values["--pipeline-model-parallel-layout"] == "Et*15|t*16|t*17|t*13mL"
    if "--pipeline-model-parallel-layout" in values:
        layout = PipelineParallelLayerLayout(values["--pipeline-model-parallel-layout"], plan.pp)
        mtp = values.get("--mtp-num-layers")
        layout.validate_layer_layout(int(values["--num-layers"]), int(mtp) if mtp else None)
        assert layout.virtual_pipeline_model_parallel_size == plan.vpp


# ---------------------------------------------------------------- DeepSpeed
def _deepspeed_text(name: str, path: Path) -> str | None:
    """The export's text, or None after checking DeepSpeed's refusal (ZeRO-2/3 with its pipeline engine)."""
    if refused(load(name, path)[1], "deepspeed"):
        with pytest.raises(ExportError, match="re-plan with --zero 1 or --pp 1"):
            render(name, "deepspeed", path=path)
        return None
    return render(name, "deepspeed", path=path).text


@pytest.mark.parametrize("name", CASES)
def test_deepspeed_option_names_and_keys(name, plan_files):
    text = _deepspeed_text(name, plan_files[name])
    if text is not None:
        assert not set(flags(bash_array(text, "MDS_ARGS"))) - MDS_OPTIONS
        cfg = heredoc_json(text)
        assert set(cfg) <= DS_KEYS and set(cfg["zero_optimization"]) <= DS_ZERO_KEYS


class _DataParallel:
    """The slice of Megatron's mpu that DeepSpeedConfig asks for."""

    def __init__(self, size: int):
        self.size = size

    def get_data_parallel_world_size(self) -> int:
        return self.size


@pytest.mark.parametrize("name", CASES)
def test_deepspeed_config_parsed_by_deepspeed(name, plan_files, monkeypatch):
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed")
    from deepspeed.runtime import config as ds_config

    plan = load(name, plan_files[name])[1]
    text = _deepspeed_text(name, plan_files[name])
    if text is None:
        return
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
    cfg = ds_config.DeepSpeedConfig(heredoc_json(text), mpu=_DataParallel(plan.dp))
    assert cfg.world_size == plan.dp
    assert cfg.train_batch_size == plan.global_batch
    assert cfg.gradient_accumulation_steps == plan.global_batch // (plan.dp * plan.micro_batch)
    assert cfg.zero_optimization_stage == plan.zero
    assert cfg.bfloat16_config.enabled == (plan.precision in ("bf16", "fp8"))


# ---------------------------------------------------------------- torchtitan
def _torchtitan_major_minor() -> tuple[int, int] | None:
    if importlib.util.find_spec("torchtitan") is None:
        return None
    from importlib.metadata import version

    major, minor = (int(x) for x in re.findall(r"\d+", version("torchtitan"))[:2])
    return major, minor


@pytest.mark.parametrize("name", CASES)
def test_torchtitan_toml_parsed_by_torchtitan(name, plan_files, tmp_path):
    ver = _torchtitan_major_minor()
    if ver is None or ver >= (0, 3):
        pytest.skip("needs torchtitan 0.1/0.2 (the TOML layout)")
    import torchtitan.components.quantization  # noqa: F401  (registers the float8 converters)
    from torchtitan.config import ConfigManager
    from torchtitan.protocols.model_converter import _registry_model_converter_cls

    plan = load(name, plan_files[name])[1]
    path = tmp_path / "job.toml"
    path.write_text(render(name, "torchtitan", path=plan_files[name]).text)
    job = ConfigManager().parse_args(["--job.config_file", str(path)])
    assert job.parallelism.tensor_parallel_degree == plan.tp
    assert job.parallelism.pipeline_parallel_degree == plan.pp
    assert job.parallelism.context_parallel_degree == plan.cp
    assert job.training.global_batch_size == plan.global_batch
    assert job.training.seq_len == plan.seq_len
    assert job.parallelism.data_parallel_shard_degree * job.parallelism.data_parallel_replicate_degree == plan.dp
    assert set(job.model.converters) <= set(_registry_model_converter_cls)
    assert bool(job.model.converters) == (plan.precision == "fp8")


# Runs in a torchtitan >= 0.3 environment: parse every module, print what the tests compare. The float8
# converters check for an SM89+ GPU while building the config; answered yes, as a GPU machine would.
_TT3_SCRIPT = """
import json, re, sys
import torchtitan.components.quantization.float8 as f8
f8.has_cuda_capability = lambda *a, **k: True
from torchtitan.config import ConfigManager
out = {}
for module in sys.argv[1:]:
    c = ConfigManager().parse_args(["--module", module, "--config", "meshplan_config"])
    p, model = c.parallelism, c.model_spec.model
    out[module] = {"tp": p.tensor_parallel_degree, "pp": p.pipeline_parallel_degree,
                   "cp": p.context_parallel_degree, "ep": p.expert_parallel_degree,
                   "dp": p.data_parallel_shard_degree * p.data_parallel_replicate_degree,
                   "global_batch": c.training.global_batch_size, "seq_len": c.training.seq_len,
                   "float8": sorted(set(re.findall(r"Float8\\w+", repr(model)))),
                   "mtp": len(getattr(model, "mtp_layers", None) or [])}
print("MESHPLAN_JSON " + json.dumps(out))
"""


def _torchtitan3_path() -> str | None:
    """PYTHONPATH entry holding torchtitan >= 0.3: "" for this environment's own, else make's side directory."""
    ver = _torchtitan_major_minor()
    if ver is not None and ver >= (0, 3):
        return ""
    side = Path(sys.prefix) / "torchtitan3"
    return str(side) if (side / "torchtitan").is_dir() else None


_TT3_MTP = "deepseek-v3+mtp-fp8"
_TT3_MTP_PLAN = Plan(global_batch=64, seq_len=4096, dp=64, ep=8, zero=3, precision="fp8", framework="torchtitan")


@pytest.fixture(scope="module")
def torchtitan3_parsed(plan_files, tmp_path_factory) -> dict:
    side = _torchtitan3_path()
    if side is None:
        pytest.skip("torchtitan >= 0.3 is not installed (make test puts it in .venv/torchtitan3)")
    folder = tmp_path_factory.mktemp("tt3")
    texts = {name: render(name, "torchtitan", fmt="python", path=plan_files[name]).text for name in CASES}
    # DeepSeek-V3 with its MTP module, fp8, no pipeline: MTPLoss, MTP layers and fp8 expert GEMMs
    texts[_TT3_MTP] = render_export(get_exporter("torchtitan"), flag_model("deepseek-v3+mtp"), _TT3_MTP_PLAN,
                                    catalog.framework("torchtitan"), fmt="python").text
    modules = {name: f"meshplan_export_{re.sub(r'[^a-z0-9]', '_', name)}" for name in texts}
    for name, text in texts.items():
        (folder / f"{modules[name]}.py").write_text(text)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (side, str(folder)) if p))
    run = subprocess.run([sys.executable, "-c", _TT3_SCRIPT, *modules.values()], cwd=folder, env=env,
                         capture_output=True, text=True, timeout=600)
    line = [ln for ln in run.stdout.splitlines() if ln.startswith("MESHPLAN_JSON ")]
    assert run.returncode == 0 and line, run.stderr[-3000:]
    parsed = json.loads(line[0].split(" ", 1)[1])
    return {name: parsed[module] for name, module in modules.items()}


@pytest.mark.parametrize("name", CASES)
def test_torchtitan_python_parsed_by_torchtitan(name, plan_files, torchtitan3_parsed):
    model, plan, _, _ = load(name, plan_files[name])
    got = torchtitan3_parsed[name]
    assert (got["tp"], got["pp"], got["cp"], got["dp"]) == (plan.tp, plan.pp, plan.cp, plan.dp)
    assert got["ep"] == (plan.ep if model.is_moe else 1)
    assert (got["global_batch"], got["seq_len"]) == (plan.global_batch, plan.seq_len)
    assert bool(got["float8"]) == (plan.precision == "fp8")
    assert ("Float8GroupedExperts" in got["float8"]) == (plan.precision == "fp8" and model.is_moe)


def test_torchtitan_python_builds_mtp_and_fp8_experts(torchtitan3_parsed):
    got = torchtitan3_parsed[_TT3_MTP]
    assert got["mtp"] == 1 and "Float8GroupedExperts" in got["float8"] and got["ep"] == 8


def test_torchtitan_schedule_names_exist_in_torch():
    pytest.importorskip("torch")
    import torch.distributed.pipelining as pipelining
    from torch.distributed.pipelining.schedules import get_schedule_class

    from meshplan.spec.schedules import schedule_names, schedule_spec

    # Every registered schedule's torchtitan name and torch class exist in torch.distributed.pipelining.
    for name in schedule_names():
        spec = schedule_spec(name)
        assert get_schedule_class(spec.torchtitan).__name__ == spec.torch_class
        assert getattr(pipelining, spec.torch_class)
    for name in PLANS:
        par = tomllib.loads(render(name, "torchtitan").text)["parallelism"]
        if "pipeline_parallel_schedule" in par:
            get_schedule_class(par["pipeline_parallel_schedule"])


def test_golden_dir_has_every_plan():
    assert {p.stem for p in (GOLDEN / "plans").glob("*.toml")} == set(PLANS)
    assert json.dumps(PLANS)
