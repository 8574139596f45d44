"""Exports read by the frameworks' own configuration parsers where they install on a CPU machine, and checked
against the frameworks' documented option names everywhere.

Parsers (skipped when the package is missing):
- DeepSpeed: ``deepspeed.runtime.config.DeepSpeedConfig`` on the JSON, with the plan's data-parallel size.
- torchtitan 0.2.x: ``torchtitan.config.ConfigManager`` on the TOML (``--job.config_file``; rejects unknown keys).
- torchtitan >= 0.3: ``ConfigManager`` on the Python module (``--module ... --config meshplan_config``).
- Megatron-LM: ``pretrain_gpt.py``'s parser is not on PyPI; megatron-core's ``PipelineParallelLayerLayout``
  parses the layout strings, and every flag must be one of the option names listed below.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import tomllib

import pytest
from test_export import GOLDEN, PLANS, bash_array, heredoc_json, load, render

# megatron/training/arguments.py (NVIDIA/Megatron-LM, commit 000c4ac2): _add_network_size_args,
# _add_training_args, _add_distributed_args, _add_mixed_precision_args, _add_transformer_engine_args,
# _add_moe_args, _add_mla_args, _add_tokenizer_args, _add_data_args
MEGATRON_OPTIONS = {
    "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--kv-channels",
    "--group-query-attention", "--num-query-groups", "--max-position-embeddings", "--position-embedding-type",
    "--normalization", "--swiglu", "--squared-relu", "--untie-embeddings-and-output-weights",
    "--disable-bias-linear", "--multi-latent-attention", "--vocab-size", "--seq-length",
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
    "--moe-token-dispatcher-type", "--moe-expert-capacity-factor",
    "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim",
    "--use-precision-aware-optimizer", "--main-grads-dtype", "--exp-avg-dtype", "--exp-avg-sq-dtype",
    "--recompute-modules",
}
MEGATRON_CHOICES = {"--position-embedding-type": {"learned_absolute", "rope", "mrope", "relative", "none"},
                    "--normalization": {"LayerNorm", "RMSNorm"}, "--recompute-granularity": {"full", "selective"},
                    "--recompute-method": {"uniform", "block"}, "--fp8-format": {"e4m3", "hybrid"},
                    "--data-parallel-sharding-strategy": {"no_shard", "optim", "optim_grads",
                                                          "optim_grads_params"},
                    "--moe-token-dispatcher-type": {"allgather", "alltoall", "flex"}}

# megatron/arguments.py (deepspeedai/Megatron-DeepSpeed, commit 207b2d5a) plus deepspeed.add_config_arguments
MDS_OPTIONS = {
    "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--num-key-value-heads",
    "--seq-length", "--max-position-embeddings", "--normalization", "--swiglu", "--squared-relu",
    "--use-rotary-position-embeddings", "--no-position-embedding", "--untie-embeddings-and-output-weights",
    "--num-experts", "--topk", "--expert-interval", "--moe-expert-parallel-size",
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


def flags(words: list[str]) -> list[str]:
    return [w for w in words if w.startswith("--")]


@pytest.mark.parametrize("name", PLANS)
def test_megatron_option_names(name):
    words = bash_array(render(name, "megatron").text, "MEGATRON_ARGS")
    unknown = set(flags(words)) - MEGATRON_OPTIONS
    assert not unknown
    for i, w in enumerate(words[:-1]):
        if w in MEGATRON_CHOICES:
            assert words[i + 1] in MEGATRON_CHOICES[w], (w, words[i + 1])


@pytest.mark.parametrize("name", PLANS)
def test_megatron_layout_parsed_by_megatron_core(name):
    layout_mod = "megatron.core.transformer.pipeline_parallel_layer_layout"
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec(layout_mod) is None:
        pytest.skip("megatron-core is not installed")
    from megatron.core.transformer.pipeline_parallel_layer_layout import (
        PipelineParallelLayerLayout,
    )

    model, plan, _, _ = load(name)
    words = bash_array(render(name, "megatron").text, "MEGATRON_ARGS")
    if "--pipeline-model-parallel-layout" not in words:
        pytest.skip("this plan needs no layout string")
    layout = PipelineParallelLayerLayout(words[words.index("--pipeline-model-parallel-layout") + 1], plan.pp)
    layout.validate_layer_layout(model.n_layers, None)
    assert layout.virtual_pipeline_model_parallel_size == plan.vpp


@pytest.mark.parametrize("name", PLANS)
def test_deepspeed_option_names_and_keys(name):
    text = render(name, "deepspeed").text
    assert not set(flags(bash_array(text, "MDS_ARGS"))) - MDS_OPTIONS
    cfg = heredoc_json(text)
    assert set(cfg) <= DS_KEYS and set(cfg["zero_optimization"]) <= DS_ZERO_KEYS


class _DataParallel:
    """The slice of Megatron's mpu that DeepSpeedConfig asks for."""

    def __init__(self, size: int):
        self.size = size

    def get_data_parallel_world_size(self) -> int:
        return self.size


@pytest.mark.parametrize("name", PLANS)
def test_deepspeed_config_parsed_by_deepspeed(name, monkeypatch):
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed")
    from deepspeed.runtime import config as ds_config

    _, plan, _, _ = load(name)
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
    cfg = ds_config.DeepSpeedConfig(heredoc_json(render(name, "deepspeed").text), mpu=_DataParallel(plan.dp))
    assert cfg.world_size == plan.dp
    assert cfg.train_batch_size == plan.global_batch
    assert cfg.gradient_accumulation_steps == plan.global_batch // (plan.dp * plan.micro_batch)
    assert cfg.zero_optimization_stage == plan.zero
    assert cfg.bfloat16_config.enabled == (plan.precision in ("bf16", "fp8"))


def _torchtitan_major_minor() -> tuple[int, int] | None:
    if importlib.util.find_spec("torchtitan") is None:
        return None
    from importlib.metadata import version

    major, minor = (int(x) for x in re.findall(r"\d+", version("torchtitan"))[:2])
    return major, minor


@pytest.mark.parametrize("name", PLANS)
def test_torchtitan_toml_parsed_by_torchtitan(name, tmp_path):
    ver = _torchtitan_major_minor()
    if ver is None or ver >= (0, 3):
        pytest.skip("needs torchtitan 0.1/0.2 (the TOML layout)")
    from torchtitan.config import ConfigManager

    _, plan, _, _ = load(name)
    path = tmp_path / "job.toml"
    path.write_text(render(name, "torchtitan").text)
    job = ConfigManager().parse_args(["--job.config_file", str(path)])
    assert job.parallelism.tensor_parallel_degree == plan.tp
    assert job.parallelism.pipeline_parallel_degree == plan.pp
    assert job.parallelism.context_parallel_degree == plan.cp
    assert job.training.global_batch_size == plan.global_batch
    assert job.training.seq_len == plan.seq_len
    assert job.parallelism.data_parallel_shard_degree * job.parallelism.data_parallel_replicate_degree == plan.dp


@pytest.mark.parametrize("name", PLANS)
def test_torchtitan_python_parsed_by_torchtitan(name, tmp_path, monkeypatch):
    ver = _torchtitan_major_minor()
    if ver is None or ver < (0, 3):
        pytest.skip("needs torchtitan >= 0.3 (the Python config layout)")
    from torchtitan.config import ConfigManager

    _, plan, _, _ = load(name)
    if plan.precision == "fp8":
        # building the config swaps in Float8Linear, which needs torchao and an SM89+ GPU at parse time
        torch = pytest.importorskip("torch")
        if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
            pytest.skip("torchtitan >= 0.3 builds its float8 converter only on an SM89+ GPU")
        pytest.importorskip("torchao")
    module = f"meshplan_export_{name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(render(name, "torchtitan", fmt="python").text)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = ConfigManager().parse_args(["--module", module, "--config", "meshplan_config"])
    sys.modules.pop(module, None)
    assert config.parallelism.tensor_parallel_degree == plan.tp
    assert config.parallelism.pipeline_parallel_degree == plan.pp
    assert config.parallelism.context_parallel_degree == plan.cp
    assert config.training.global_batch_size == plan.global_batch


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
