"""torchtitan >= 0.3 layout: a Python config-registry module (``torchtitan/config/configs.py`` dataclasses).

The module starts from the torchtitan config function of the model (``llama3_70b`` ...) and replaces its
training, parallelism, activation-checkpoint and compile configs with the plan's. Load it with
``python -m torchtitan.train --module THIS_MODULE --config meshplan_config``.
"""

from __future__ import annotations

from meshplan.cost.stage import mtp_depth
from meshplan.export.base import ExportResult, comment_block, header_lines
from meshplan.export.torchtitan import TitanModel, job_sections, titan_model
from meshplan.spec.framework import FrameworkProfile
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import Plan

_AC_CLASSES = {"full": "FullAC.Config()", "selective": "SelectiveAC.Config()", "none": "None"}


def _kwargs(table: dict, indent: str) -> str:
    return "".join(f"{indent}{k}={v!r},\n" for k, v in table.items())


def _parallelism_0_3(par: dict, notes: list[str]) -> tuple[dict, dict]:
    """0.2 [parallelism] keys -> (ParallelismConfig kwargs, CompileConfig extras) of 0.3."""
    par = dict(par)
    compile_extra = {}
    if par.pop("enable_async_tensor_parallel", False):
        compile_extra["enable_async_tensor_parallel"] = True
    etp = par.pop("expert_tensor_parallel_degree", 1)
    if etp > 1:
        notes.append(f"etp={etp}: torchtitan >= 0.3 has no expert tensor-parallel degree; experts use ep only")
    return par, compile_extra


def _model_spec(model: ModelSpec, plan: Plan, tm: TitanModel, *, compile_on: bool,
                notes: list[str]) -> tuple[list[str], list[str]]:
    """(import lines, body lines) that rebuild ``config.model_spec`` for fp8 and MTP, when either applies.

    fp8 as torchtitan 0.3.0's own ``deepseek_v3_671b_float8`` (models/deepseek_v3/config_registry.py):
    Float8LinearConverter with the head and router in bf16, and Float8GroupedExpertsConverter for the expert
    grouped GEMMs. MTP as its ``deepseek_v3_debugmodel_mtp``: ``model_registry(num_mtp_layers=...)`` with MTPLoss,
    written for pp = 1 only (0.3.0's pipeline split names no MTP module)."""
    flavor, converters, imports = titan_flavor_of(tm.config_fn), [], []
    if plan.precision == "fp8":
        names = ["Float8LinearConverter"] + (["Float8GroupedExpertsConverter"] if model.is_moe else [])
        imports.append(f"from torchtitan.components.quantization import {', '.join(names)}")
        skip = ["lm_head"] + (["router.gate"] if model.is_moe else [])
        converters.append(f"Float8LinearConverter.Config(filter_fqns={skip!r}, model_compile_enabled={compile_on})")
        if model.is_moe:
            converters.append(f"Float8GroupedExpertsConverter.Config(model_compile_enabled={compile_on})")
    mtp = mtp_depth(model) if tm.name == "deepseek_v3" and plan.pp == 1 else 0
    if mtp_depth(model) and not mtp:
        notes.append(f"{mtp_depth(model)} multi-token-prediction module(s): torchtitan 0.3.0 builds MTP for "
                     "deepseek_v3 without pipeline parallelism only; exported without them")
    if not converters and not mtp:
        return imports, []
    kwargs = (f", num_mtp_layers={mtp}" if mtp else "") + (", converters=[" if converters else "")
    body = [f"    config.model_spec = model_registry({flavor!r}{kwargs}"]
    body += [f"        {c}," for c in converters] + (["    ])"] if converters else ["    )"])
    if mtp:
        imports += ["from torchtitan.models.common.config_utils import decoder_vocab_size",
                    "from torchtitan.models.deepseek_v3.mtp import MTPLoss"]
        body.append("    config.loss = MTPLoss.Config(global_vocab_size=decoder_vocab_size(config.model_spec))")
    return imports, body


def render_python(model: ModelSpec, plan: Plan, stack: FrameworkProfile, *, gpus: str = "",
                  target: str = "") -> ExportResult:
    """The config-registry module text and its approximations."""
    doc, notes = job_sections(model, plan, stack, head="lm_head")
    tm, _ = titan_model(model)
    par, compile_extra = _parallelism_0_3(doc["parallelism"], notes)
    par["enable_sequence_parallel"] = plan.sp or plan.tp == 1
    ac = doc["activation_checkpoint"]["mode"]
    if doc["activation_checkpoint"].get("selective_ac_option", "op") != "op":
        notes.append("layer-level selective AC: torchtitan >= 0.3 has per-op selective AC only; "
                     "exported as full AC")
        ac = "full"
    compile_on = bool(doc.get("compile")) or bool(compile_extra)
    spec_imports, spec_body = _model_spec(model, plan, tm, compile_on=compile_on, notes=notes)
    head = header_lines(framework="torchtitan", target=target, model=model, plan=plan, gpus=gpus,
                        approximations=tuple(notes))
    head.append("run: torchrun ... -m torchtitan.train --module THIS_MODULE --config meshplan_config")
    lines = ['"""meshplan export: torchtitan >= 0.3 config registry."""', comment_block(head), "",
             "from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig",
             "from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC",
             f"from torchtitan.models.{tm.name} import model_registry",
             f"from torchtitan.models.{tm.name}.config_registry import {tm.config_fn}", *spec_imports]
    lines += ["", "", "def meshplan_config():", f'    """{model.name} on {plan.n_gpus} GPUs."""',
              f"    config = {tm.config_fn}()"]
    if titan_flavor_of(tm.config_fn) != tm.flavor:
        # an unregistered flavor would fail at load time; the base model stays until the user registers it
        lines.append(f"    # register flavor {tm.flavor!r} in torchtitan.models.{tm.name}, then use it below")
    training = dict(doc["training"])
    if plan.pp > 1 or plan.ep > 1:
        # torchtitan >= 0.3 captures CUDA graphs by default, which it refuses with pp (and most ep backends)
        training["disable_cuda_graphs"] = True
    lines += spec_body + [
        "    config.training = TrainingConfig(", _kwargs(training, " " * 8).rstrip("\n"), "    )",
        "    config.parallelism = ParallelismConfig(", _kwargs(par, " " * 8).rstrip("\n"), "    )",
        f"    config.activation_checkpoint = {_AC_CLASSES[ac]}",
        f"    config.compile = CompileConfig(enable={compile_on}{_extra(compile_extra)})", "    return config", ""]
    return ExportResult(text="\n".join(lines), approximations=tuple(notes))


def titan_flavor_of(config_fn: str) -> str:
    """The flavor a torchtitan config function builds (``llama3_70b`` -> ``70B``)."""
    return config_fn.rsplit("_", 1)[-1].upper()


def _extra(extra: dict) -> str:
    return "".join(f", {k}={v!r}" for k, v in extra.items())
