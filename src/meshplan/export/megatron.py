"""Megatron-LM exporter: the ``pretrain_gpt.py`` arguments of a plan, as a bash array.

Option names are those of NVIDIA/Megatron-LM ``megatron/training/arguments.py`` (network size, training,
distributed, mixed precision, Transformer-Engine, MoE and MLA groups). Uneven pipeline splits use
``--decoder-first/last-pipeline-num-layers`` when only the end stages differ, else the
``--pipeline-model-parallel-layout`` string (``E`` embedding, ``t`` decoder layer, ``m`` MTP module, ``L`` loss,
``|`` between stages). The model-defining arguments are built in ``megatron_model``.
"""

from __future__ import annotations

from meshplan import catalog
from meshplan.cost.stage import mtp_depth
from meshplan.export.base import ExportResult, comment_block, header_lines
from meshplan.export.layout import decoder_split, first_last_split, is_csv_schedule, uniform_split
from meshplan.export.megatron_model import Args, model_args
from meshplan.spec.framework import FrameworkProfile
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import Plan


def _parallel_args(model: ModelSpec, plan: Plan, stack: FrameworkProfile) -> tuple[Args, list[str]]:
    args: Args = [("--tensor-model-parallel-size", plan.tp), ("--pipeline-model-parallel-size", plan.pp)]
    notes: list[str] = []
    if plan.cp > 1:
        args += [("--context-parallel-size", plan.cp), ("--cp-comm-type", "a2a" if plan.cp_kind == "a2a" else "p2p")]
    if model.is_moe:
        args += [("--expert-model-parallel-size", plan.ep), ("--expert-tensor-parallel-size", plan.etp)]
    if plan.sp and plan.tp > 1:
        args.append(("--sequence-parallel", None))
    if stack.tp_comm_overlap and plan.tp > 1 and plan.sp:
        args.append(("--tp-comm-overlap", None))
    elif stack.tp_comm_overlap and plan.tp > 1:
        # arguments.py validate_args: "Tensor parallel communication/GEMM overlap can happen only when sequence
        # parallelism is enabled"
        notes.append("TP communication overlap without sequence parallelism: Megatron-LM refuses "
                     "--tp-comm-overlap without --sequence-parallel; exported without it")
    if plan.rank_order == "tp-cp-ep-pp-dp":
        args.append(("--use-tp-pp-dp-mapping", None))
    elif plan.rank_order != "tp-cp-ep-dp-pp":
        notes.append(f"rank order {plan.rank_order}: Megatron-LM builds tp-cp-ep-dp-pp (or tp-cp-ep-pp-dp with "
                     "--use-tp-pp-dp-mapping); exported with its default order")
    return args, notes


def layout_string(split: tuple[int, ...], mtp: int = 0) -> str:
    """Megatron ``--pipeline-model-parallel-layout`` for decoder layers per virtual stage in pipeline order, with
    ``mtp`` multi-token-prediction modules (``m``) before the loss on the last stage
    (megatron/core/transformer/pipeline_parallel_layer_layout.py).

    Example: (3, 4, 4, 2) -> ``Et*3|t*4|t*4|t*2L``; with mtp=1 the last stage is ``t*2mL``.
    """
    stages = [f"t*{n}" if n else "" for n in split]
    stages[0] = "E" + stages[0]
    stages[-1] = stages[-1] + "m" * mtp + "L"
    return "|".join(stages)


def _pipeline_args(model: ModelSpec, plan: Plan) -> tuple[Args, list[str]]:
    notes: list[str] = []
    name = plan.schedule_name
    if is_csv_schedule(plan):
        notes.append(f"schedule CSV {name}: Megatron-LM runs only its built-in schedules; exported as "
                     f"{'interleaved 1F1B' if plan.vpp > 1 else '1F1B'}")
    elif name not in catalog.framework("megatron-core").schedules:
        notes.append(f"schedule {name}: Megatron-LM has no such schedule (it runs 1F1B, interleaved when virtual "
                     "stages are set); exported as " + ("interleaved 1F1B" if plan.vpp > 1 else "1F1B"))
    if plan.pp == 1:
        return [], notes
    # the MTP modules go on the last stage, where Megatron-Core builds them unless a layout says otherwise
    split = decoder_split(model, plan)
    per_stage, ends = uniform_split(split), first_last_split(split)
    if per_stage and plan.vpp > 1:
        return [("--num-layers-per-virtual-pipeline-stage", per_stage)], notes
    if per_stage:
        return [], notes
    if ends and plan.vpp == 1:
        return [("--decoder-first-pipeline-num-layers", ends[0]),
                ("--decoder-last-pipeline-num-layers", ends[1])], notes
    return [("--pipeline-model-parallel-layout", layout_string(split, mtp_depth(model)))], notes


def _batch_and_memory_args(plan: Plan, stack: FrameworkProfile) -> tuple[Args, list[str]]:
    args: Args = [("--micro-batch-size", plan.micro_batch), ("--global-batch-size", plan.global_batch)]
    notes: list[str] = []
    if plan.recompute == "full":
        args.append(("--recompute-granularity", "full"))
        if plan.recompute_layers:
            args += [("--recompute-method", "block"), ("--recompute-num-layers", plan.recompute_layers)]
        else:
            args += [("--recompute-method", "uniform"), ("--recompute-num-layers", 1)]
    elif plan.recompute == "selective":
        args.append(("--recompute-granularity", "selective"))
        if stack.selective_policy == "mla_up_proj":
            args.append(("--recompute-modules", "mla_up_proj"))
        elif stack.selective_policy == "op":
            notes.append("selective recompute, per-op policy (torchtitan): Megatron-LM has no such module set; "
                         "exported as its default, the attention core")
    if plan.zero >= 1:
        args.append(("--use-distributed-optimizer", None))
    if plan.zero >= 2:
        strategy = "optim_grads" if plan.zero == 2 else "optim_grads_params"
        args += [("--use-megatron-fsdp", None), ("--data-parallel-sharding-strategy", strategy)]
    if plan.zero and plan.dp_replicate > 1:
        args.append(("--num-distributed-optimizer-instances", plan.dp_replicate))
    if stack.overlap_grad_reduce and plan.dp > 1:
        args.append(("--overlap-grad-reduce", None))
    if stack.overlap_param_gather and plan.zero >= 1 and plan.dp > 1:
        args.append(("--overlap-param-gather", None))
    return args, notes


def _optimizer_args(plan: Plan, stack: FrameworkProfile) -> tuple[Args, list[str]]:
    """16-bit gradient buffers (``--grad-reduce-in-bf16``, as Megatron-LM's Llama examples pass it) and
    Megatron-LM's precision-aware optimizer for 16-bit Adam moments (its main gradients then bf16 too), and what
    they cannot say."""
    args: Args = []
    notes = [] if stack.fused_optimizer else [
        "fused_optimizer=false: Megatron-LM's Adam is always multi-tensor (TE/apex FusedAdam)"]
    if stack.grad_dtype == "bf16" and plan.precision != "fp16":
        args.append(("--grad-reduce-in-bf16", None))
    if stack.optimizer_dtype == "bf16":
        args.append(("--use-precision-aware-optimizer", None))
        if stack.grad_dtype == "bf16":
            args.append(("--main-grads-dtype", "bf16"))
        args += [("--exp-avg-dtype", "bf16"), ("--exp-avg-sq-dtype", "bf16")]
        if plan.zero == 0:
            notes.append("16-bit Adam moments: Megatron-LM's precision-aware optimizer needs the distributed "
                         "optimizer (zero >= 1)")
    return args, notes


def _precision_args(plan: Plan, stack: FrameworkProfile) -> Args:
    if plan.precision == "fp8":
        gather = [("--fp8-param-gather", None)] if stack.fp8_params and plan.zero < 3 else []
        return [("--bf16", None), ("--fp8-format", "hybrid")] + gather
    return {"bf16": [("--bf16", None)], "fp16": [("--fp16", None)], "fp32": []}[plan.precision]


def megatron_args(model: ModelSpec, plan: Plan, stack: FrameworkProfile) -> tuple[Args, tuple[str, ...]]:
    """The pretrain_gpt.py arguments for the plan under the stack's settings, and the approximations they make."""
    shape, n1 = model_args(model, plan)
    par, n2 = _parallel_args(model, plan, stack)
    pipe, n3 = _pipeline_args(model, plan)
    mem, n4 = _batch_and_memory_args(plan, stack)
    opt, n5 = _optimizer_args(plan, stack)
    args = shape + par + pipe + mem + opt + _precision_args(plan, stack)
    return args, tuple(n1 + n2 + n3 + n4 + n5)


def format_args(args: Args, *, indent: str = "    ") -> list[str]:
    """One ``--flag value`` per line, values shell-quoted when they hold shell metacharacters."""
    out = []
    for flag, value in args:
        if value is None:
            out.append(indent + flag)
            continue
        text = str(value)
        if any(c in text for c in "()*|[]+ "):
            text = f"'{text}'"
        out.append(f"{indent}{flag} {text}")
    return out


class MegatronExporter:
    """``meshplan export --to megatron``: a bash file defining MEGATRON_ARGS for pretrain_gpt.py."""

    name = "megatron"
    stacks = ("megatron-core", "megatron-lm-2021", "megatron-lm-2022", "nemo", "megatron-bridge")
    formats = ("sh",)
    description = "Megatron-LM pretrain_gpt.py arguments (bash array)"

    def target(self, fmt: str) -> str:
        """The release whose parser the arguments are written for (checked against megatron-core 0.16.1's
        TransformerConfig in the tests; every name also exists at Megatron-LM 000c4ac2, 2025-11-13)."""
        return "Megatron-LM core_v0.16.1 (megatron-core 0.16.1) pretrain_gpt.py"

    def suffix(self, fmt: str) -> str:
        """Bash script."""
        return ".sh"

    def render(self, model: ModelSpec, plan: Plan, stack: FrameworkProfile, *, gpus: str = "",
               fmt: str = "") -> ExportResult:
        """The arguments as a bash array plus a commented torchrun line."""
        args, notes = megatron_args(model, plan, stack)
        head = header_lines(framework="Megatron-LM", target=self.target(fmt), model=model, plan=plan, gpus=gpus,
                            approximations=notes)
        launch = [f"launch on {plan.n_gpus} GPUs, adding tokenizer, data and optimizer arguments:",
                  "  torchrun --nnodes $NNODES --nproc-per-node $GPUS_PER_NODE pretrain_gpt.py \\",
                  '      "${MEGATRON_ARGS[@]}" --tokenizer-type ... --data-path ... --lr ... --train-iters ...']
        text = "\n".join(["#!/usr/bin/env bash", comment_block(head), comment_block(launch),
                          "MEGATRON_ARGS=(", *format_args(args), ")", ""])
        return ExportResult(text=text, approximations=notes)
