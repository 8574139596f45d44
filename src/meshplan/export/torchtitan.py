"""torchtitan exporter: the job configuration of a plan.

Two layouts: ``toml`` is the TOML job file of torchtitan 0.1/0.2 (``torchtitan/config/job_config.py``, read by
``ConfigManager`` with ``--job.config_file``); ``python`` is the config-registry module of torchtitan >= 0.3
(``torchtitan/config/configs.py``; ``--module FILE_MODULE --config meshplan_config``).

Mapping (meshplan -> torchtitan): dp_replicate/dp_shard -> data_parallel_replicate/shard_degree (FSDP2; HSDP when
both > 1), tp -> tensor_parallel_degree, cp -> context_parallel_degree, pp -> pipeline_parallel_degree with the
split written out as module_fqns_per_model_part, ep/etp -> expert_(tensor_)parallel_degree, micro-batches ->
local_batch_size/pipeline_parallel_microbatch_size, recompute -> activation_checkpoint, fp8 -> float8 converter.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.cost.stage import mtp_depth
from meshplan.export.base import (
    ExportResult,
    comment_block,
    header_lines,
    resolve_format,
)
from meshplan.export.layout import decoder_layers, decoder_split, is_csv_schedule, model_notes
from meshplan.spec.framework import FrameworkProfile
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import Plan
from meshplan.spec.schedules import schedule_spec

# (family, n_layers, hidden) -> (torchtitan model name, flavor, >=0.3 config-registry function, RoPE of the flavor
# as (theta, scaling, factor)). RoPE from torchtitan 0.2.2 models/llama3/model/args.py (rope_theta 500000 in each
# flavor, RoPEScalingArgs factor 8 always applied; 0.3.0 ComplexRoPE(theta=500000, scaling="llama")) and
# models/deepseek_v3/model/args.py (rope_theta 10000, rope_factor 40).
_LLAMA3_ROPE = (500000.0, "llama3", 8.0)
_FLAVORS = {
    ("llama", 32, 4096): ("llama3", "8B", "llama3_8b", _LLAMA3_ROPE),
    ("llama", 80, 8192): ("llama3", "70B", "llama3_70b", _LLAMA3_ROPE),
    ("llama", 126, 16384): ("llama3", "405B", "llama3_405b", _LLAMA3_ROPE),
    ("deepseek_v3", 61, 7168): ("deepseek_v3", "671B", "deepseek_v3_671b", (10000.0, "yarn", 40.0)),
}


@dataclass(frozen=True, kw_only=True)
class TitanModel:
    """Where the model lives in torchtitan's registry."""

    name: str
    """torchtitan model name (``llama3``, ``deepseek_v3``)."""
    flavor: str
    """Flavor in that model's registry."""
    config_fn: str
    """torchtitan >= 0.3 config-registry function to start from."""


def titan_model(model: ModelSpec) -> tuple[TitanModel, list[str]]:
    """The torchtitan model and flavor for a meshplan model, and a note when torchtitan ships none or when its
    flavor's RoPE is not the model's."""
    key = (model.family, decoder_layers(model), model.hidden)
    if key in _FLAVORS:
        name, flavor, fn, rope = _FLAVORS[key]
        ours = (model.rope_theta, model.rope_scaling, model.rope_scaling_factor if model.rope_scaling != "none"
                else 1.0)
        notes = [] if ours == rope else [
            f"RoPE: torchtitan's {name} {flavor} uses base {rope[0]:g} with {rope[1]} scaling x{rope[2]:g}; the model "
            f"has base {ours[0]:g}, scaling {ours[1]}" + (f" x{ours[2]:g}" if ours[1] != "none" else "")]
        return TitanModel(name=name, flavor=flavor, config_fn=fn), notes
    base = "deepseek_v3" if model.is_moe else "llama3"
    fn = "deepseek_v3_671b" if model.is_moe else "llama3_8b"
    note = (f"model {model.name}: torchtitan ships no flavor with {decoder_layers(model)} layers x {model.hidden} "
            f"({model.family}); the config names flavor '{model.name}' of '{base}', which you must register")
    return TitanModel(name=base, flavor=model.name, config_fn=fn), [note]


def stage_fqns(split: tuple[int, ...], *, head: str) -> list[list[str]]:
    """Module names per pipeline stage: embeddings on the first, final norm and ``head`` on the last.

    Example: (2, 1) -> [["tok_embeddings", "layers.0", "layers.1"], ["layers.2", "norm", "output"]].
    """
    out, start = [], 0
    for n in split:
        out.append([f"layers.{i}" for i in range(start, start + n)])
        start += n
    out[0].insert(0, "tok_embeddings")
    out[-1] += ["norm", head]
    return out


def _dp_degrees(plan: Plan) -> tuple[dict, list[str]]:
    notes = []
    if plan.zero == 0:
        return {"data_parallel_replicate_degree": plan.dp, "data_parallel_shard_degree": 1}, notes
    sec = {"data_parallel_replicate_degree": plan.dp_replicate, "data_parallel_shard_degree": plan.shard_group}
    if plan.zero < 3:
        # FSDP2 that keeps parameters gathered from forward to backward is closest to ZeRO-1/2
        sec["fsdp_reshard_after_forward"] = "never"
        if plan.zero == 1:
            notes.append("ZeRO-1: torchtitan shards with FSDP2 only; exported as FSDP without resharding after "
                         "forward (gradients are sharded too, as in ZeRO-2)")
    return sec, notes


def _pipeline(model: ModelSpec, plan: Plan, *, head: str) -> tuple[dict, list[str]]:
    if plan.pp == 1:
        return {}, []
    notes, name = [], plan.schedule_name
    sec: dict = {"pipeline_parallel_degree": plan.pp, "pipeline_parallel_microbatch_size": plan.micro_batch}
    if is_csv_schedule(plan):
        sec["pipeline_parallel_schedule"] = "PipelineScheduleMulti" if plan.vpp > 1 else "PipelineScheduleSingle"
        sec["pipeline_parallel_schedule_csv"] = name
    elif name == "zb_h1" and plan.vpp == 1:
        notes.append("schedule zb_h1 on one stage per rank: torch.distributed.pipelining has zero-bubble "
                     "schedules only for several stages per rank; exported as 1F1B")
        sec["pipeline_parallel_schedule"] = "1F1B"
    else:
        # torch.distributed.pipelining's get_schedule_class name, as the schedule registry spells it.
        sec["pipeline_parallel_schedule"] = schedule_spec(name).torchtitan
    sec["module_fqns_per_model_part"] = stage_fqns(decoder_split(model, plan), head=head)
    return sec, notes


def parallelism(model: ModelSpec, plan: Plan, stack: FrameworkProfile, *,
                head: str = "output") -> tuple[dict, list[str]]:
    """The [parallelism] table (torchtitan 0.2 names) and its approximations."""
    sec, notes = _dp_degrees(plan)
    sec["tensor_parallel_degree"] = plan.tp
    if plan.tp > 1 and not plan.sp:
        notes.append("tp without sequence parallel: torchtitan's TP plan always shards norms over the sequence")
    if stack.tp_comm_overlap and plan.tp > 1:
        sec["enable_async_tensor_parallel"] = True
    pipe, pipe_notes = _pipeline(model, plan, head=head)
    sec.update(pipe)
    sec["context_parallel_degree"] = plan.cp
    if plan.cp > 1 and plan.cp_kind == "a2a":
        notes.append("all-to-all (Ulysses) context parallel: torchtitan's CP is ring attention; exported as ring")
    if model.is_moe:
        sec["expert_parallel_degree"] = plan.ep
        sec["expert_tensor_parallel_degree"] = plan.etp
        if (sec["data_parallel_shard_degree"] * plan.cp * plan.tp) % plan.ep:
            notes.append(f"ep={plan.ep}: torchtitan takes experts out of dp_shard*cp*tp="
                         f"{sec['data_parallel_shard_degree'] * plan.cp * plan.tp}, which it does not divide")
    if plan.rank_order != "tp-cp-ep-dp-pp":
        notes.append(f"rank order {plan.rank_order}: torchtitan's mesh is pp, dp_replicate, dp_shard, cp, tp "
                     "(outermost first); exported with that order")
    return sec, notes + pipe_notes


def training(plan: Plan, stack: FrameworkProfile) -> tuple[dict, list[str]]:
    """The [training] table: with pp every micro-batch runs inside one step, else by gradient accumulation."""
    local = plan.micro_batch * plan.n_micro if plan.pp > 1 else plan.micro_batch
    sec = {"local_batch_size": local, "global_batch_size": plan.global_batch, "seq_len": plan.seq_len,
           "mixed_precision_param": "float32" if plan.precision == "fp32" else "bfloat16"}
    notes = []
    if plan.precision == "fp16":
        notes.append("fp16: torchtitan trains in bf16 or fp32 only; exported as bf16 mixed precision")
    if stack.grad_dtype != "fp32" or stack.optimizer_dtype != "fp32":
        notes.append(f"grad_dtype={stack.grad_dtype}, optimizer_dtype={stack.optimizer_dtype}: torchtitan reduces "
                     "gradients and keeps AdamW states in fp32; exported as fp32")
    return sec, notes


def activation_checkpoint(model: ModelSpec, plan: Plan, stack: FrameworkProfile) -> tuple[dict, list[str]]:
    """The [activation_checkpoint] table."""
    if plan.recompute == "none":
        return {"mode": "none"}, []
    if plan.recompute == "selective":
        what = {"attention": "the attention core", "mla_up_proj": "MLA's up-projections"}
        notes = [] if stack.selective_policy == "op" else [
            f"selective recompute of {what[stack.selective_policy]}: torchtitan's per-op selective AC saves matmul "
            "and attention outputs and recomputes the cheap ops instead"]
        return {"mode": "selective", "selective_ac_option": "op"}, notes
    per_rank = model.n_layers // plan.pp
    if plan.recompute_layers and plan.recompute_layers < per_rank:
        every = max(1, round(per_rank / plan.recompute_layers))
        return {"mode": "selective", "selective_ac_option": str(every)}, [
            f"full recompute of {plan.recompute_layers} of {per_rank} layers per rank: torchtitan checkpoints "
            f"every n-th layer; exported as every {every}"]
    return {"mode": "full"}, []


def float8_sections(model: ModelSpec, plan: Plan, par: dict) -> tuple[list[str], dict, list[str]]:
    """Converters and [quantize] tables for fp8 (torchtitan 0.2.2 components/quantization/float8.py): the linears
    by Float8LinearConverter (head and router kept in bf16, as train_configs/llama3_405b.toml and
    deepseek_v3_671b.toml filter them), and MoE expert GEMMs by Float8GroupedMMConverter
    ([quantize.grouped_mm.float8] fqns = ["experts"]), which asserts pp = 1 and cp = 1."""
    fp8: dict = {"recipe_name": "tensorwise", "filter_fqns": ["output"] + (["router.gate"] if model.is_moe else [])}
    if par["data_parallel_shard_degree"] > 1:
        fp8 |= {"enable_fsdp_float8_all_gather": True, "precompute_float8_dynamic_scale_for_fsdp": True}
    converters, quantize = ["quantize.linear.float8"], {"linear": {"float8": fp8}}
    if not model.is_moe:
        return converters, quantize, []
    if plan.pp > 1 or plan.cp > 1:
        return converters, quantize, [
            f"fp8 expert GEMMs with pp={plan.pp}, cp={plan.cp}: torchtitan 0.2.2's Float8GroupedMMConverter asserts "
            "pp = 1 and cp = 1, so the grouped expert GEMMs stay bf16 (only the linears run fp8)"]
    quantize["grouped_mm"] = {"float8": {"fqns": ["experts"]}}
    return converters + ["quantize.grouped_mm.float8"], quantize, []


def toml_extras(model: ModelSpec, plan: Plan, doc: dict) -> list[str]:
    """Add torchtitan 0.2's fp8 tables to ``doc``; the notes for fp8 and for MTP, which 0.2 lacks."""
    notes = []
    if plan.precision == "fp8":
        converters, quantize, notes = float8_sections(model, plan, doc["parallelism"])
        doc["model"]["converters"] = converters
        doc["quantize"] = quantize
    if mtp_depth(model):
        notes.append(f"{mtp_depth(model)} multi-token-prediction module(s): torchtitan 0.2 has no MTP; exported "
                     "without them")
    return notes


def job_sections(model: ModelSpec, plan: Plan, stack: FrameworkProfile, *,
                 head: str = "output") -> tuple[dict, list[str]]:
    """Every table of the job config (0.2 names) and its approximations, fp8 and MTP aside (they differ between
    0.2 and 0.3: ``toml_extras`` and ``torchtitan_py``)."""
    tm, notes = titan_model(model)
    par, n1 = parallelism(model, plan, stack, head=head)
    tr, n2 = training(plan, stack)
    ac, n3 = activation_checkpoint(model, plan, stack)
    doc: dict = {"job": {"description": f"meshplan {model.name} on {plan.n_gpus} GPUs"},
                 "model": {"name": tm.name, "flavor": tm.flavor}, "training": tr, "parallelism": par,
                 "activation_checkpoint": ac}
    # The stack's fused_optimizer: torchtitan's [optimizer] implementation ("fused" is its default; "for-loop" is
    # torch's per-tensor path).
    doc["optimizer"] = {"name": "AdamW", "implementation": "fused" if stack.fused_optimizer else "for-loop"}
    # torch.compile where the stack fuses its elementwise ops (torchtitan-compiled), and always under AsyncTP, which
    # torchtitan refuses without it (parallelize.py: "Async TP requires --training.compile").
    if stack.fused_kernels or par.get("enable_async_tensor_parallel"):
        doc["compile"] = {"enable": True, "components": ["model", "loss"]}
    return doc, notes + model_notes(model) + n1 + n2 + n3


class TorchtitanExporter:
    """``meshplan export --to torchtitan``: TOML job file (0.1/0.2) or config-registry module (>= 0.3)."""

    name = "torchtitan"
    stacks = ("torchtitan", "torchtitan-compiled")
    formats = ("toml", "python")
    description = "torchtitan job config (TOML for 0.1/0.2, Python config registry for >= 0.3)"

    def target(self, fmt: str) -> str:
        """The release each layout is written for (the tests parse it with that release's ConfigManager)."""
        if resolve_format(self, fmt) == "python":
            return "torchtitan 0.3.0 (torchtitan/config/configs.py config registry)"
        return "torchtitan 0.2.2 (torchtitan/config/job_config.py TOML job file)"

    def suffix(self, fmt: str) -> str:
        """``.toml`` or ``.py``."""
        return ".py" if fmt == "python" else ".toml"

    def render(self, model: ModelSpec, plan: Plan, stack: FrameworkProfile, *, gpus: str = "",
               fmt: str = "") -> ExportResult:
        """The job config in the requested layout."""
        if resolve_format(self, fmt) == "python":
            from meshplan.export.torchtitan_py import render_python

            return render_python(model, plan, stack, gpus=gpus, target=self.target(fmt))
        import tomli_w

        doc, notes = job_sections(model, plan, stack)
        notes += toml_extras(model, plan, doc)
        head = header_lines(framework="torchtitan", target=self.target(fmt), model=model, plan=plan, gpus=gpus,
                            approximations=tuple(notes))
        head.append("run: torchrun ... -m torchtitan.train --job.config_file THIS_FILE")
        text = comment_block(head) + "\n\n" + tomli_w.dumps(doc)
        return ExportResult(text=text, approximations=tuple(notes))
