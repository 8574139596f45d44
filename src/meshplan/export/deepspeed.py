"""DeepSpeed exporter: the DeepSpeed JSON config plus the Megatron-DeepSpeed launch arguments.

One bash file holds both, because the JSON cannot carry comments and tp/pp live on the launcher's command line:
it writes ``ds_config.json`` from a here-document (plain JSON, as DeepSpeed's ``DeepSpeedConfig`` reads it) and
defines ``MDS_ARGS`` with the Megatron-DeepSpeed ``pretrain_gpt.py`` options (names from
deepspeedai/Megatron-DeepSpeed ``megatron/arguments.py``). JSON keys follow DeepSpeed's config-json docs and
``deepspeed/runtime/config.py``.
"""

from __future__ import annotations

import json

from meshplan.cost.stage import mtp_depth
from meshplan.export.base import ExportResult, comment_block, header_lines
from meshplan.export.layout import decoder_layers, decoder_split, model_notes, uniform_split
from meshplan.export.megatron import Args, format_args
from meshplan.export.megatron_model import vocab_args
from meshplan.spec.framework import FrameworkProfile
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import Plan


def ds_config(plan: Plan, stack: FrameworkProfile) -> tuple[dict, list[str]]:
    """The DeepSpeed JSON config as a dict, and its approximations."""
    notes: list[str] = []
    cfg: dict = {"train_batch_size": plan.global_batch, "train_micro_batch_size_per_gpu": plan.micro_batch,
                 "gradient_accumulation_steps": plan.n_micro, "gradient_clipping": 1.0,
                 "steps_per_print": 10, "wall_clock_breakdown": False}
    if plan.precision in ("bf16", "fp8"):
        cfg["bf16"] = {"enabled": True}
    elif plan.precision == "fp16":
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    if plan.precision == "fp8":
        notes.append("fp8: DeepSpeed's config has no FP8 training; exported as bf16")
    zero: dict = {"stage": plan.zero}
    if plan.zero:
        zero |= {"overlap_comm": stack.overlap_grad_reduce, "contiguous_gradients": True,
                 "reduce_scatter": True}
    if plan.zero and plan.dp_replicate > 1:
        if plan.zero == 3:
            zero["mics_shard_size"] = plan.shard_group
        else:
            notes.append(f"dp_shard={plan.shard_group} < dp={plan.dp}: DeepSpeed shards ZeRO-{plan.zero} over all "
                         "data-parallel ranks (hierarchical sharding is MiCS, ZeRO-3 only)")
    cfg["zero_optimization"] = zero
    if not stack.fused_optimizer:
        notes.append("fused_optimizer=false: the exported optimizer is DeepSpeed's default multi-tensor FusedAdam")
    if stack.grad_dtype == "bf16":
        cfg["data_types"] = {"grad_accum_dtype": "bf16"}
    if stack.optimizer_dtype == "bf16":
        notes.append("optimizer_dtype=bf16: DeepSpeed's FusedAdam keeps fp32 moments; exported as fp32")
    if plan.recompute != "none":
        cfg["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False,
                                           "cpu_checkpointing": False}
    return cfg, notes


def _model_args(model: ModelSpec, plan: Plan) -> tuple[Args, list[str]]:
    dec, att = model.decoder, model.decoder.attention
    notes = model_notes(model)
    args: Args = [("--num-layers", decoder_layers(model)), ("--hidden-size", dec.hidden),
                  ("--ffn-hidden-size", dec.ffn_hidden), ("--num-attention-heads", att.n_heads),
                  ("--seq-length", plan.seq_len), ("--max-position-embeddings", max(plan.seq_len, model.max_seq_len))]
    if att.kind == "mla":
        notes.append("multi-latent attention: Megatron-DeepSpeed has no MLA; exported as multi-head attention")
    else:
        if att.head_dim * att.n_heads != dec.hidden:
            args.append(("--kv-channels", att.head_dim))
        if att.n_kv_heads < att.n_heads:
            args.append(("--num-key-value-heads", att.n_kv_heads))
    if att.qk_norm:
        notes.append("q/k normalization: Megatron-DeepSpeed's attention has no q/k norm; exported without it")
    args += [("--normalization", dec.norm), ("--layernorm-epsilon", dec.norm_eps)]
    if dec.activation in ("swiglu", "geglu"):
        args.append(("--swiglu", None))
        if dec.activation == "geglu":
            notes.append("GeGLU: Megatron-DeepSpeed has only --swiglu for gated units; exported as SwiGLU")
    elif dec.activation == "relu2":
        args.append(("--squared-relu", None))
    if not dec.bias:
        args.append(("--disable-bias-linear", None))
        if att.qkv_bias:
            notes.append("q/k/v biases without other biases (Qwen2): Megatron-DeepSpeed has no such option; "
                         "exported without biases")
    if not model.tied_embeddings:
        args.append(("--untie-embeddings-and-output-weights", None))
    rope, rope_notes = _rope_args(model)
    return args + rope + _llama_args(model, plan, notes) + _moe_args(model, plan, notes), notes + rope_notes


def _rope_args(model: ModelSpec) -> tuple[Args, list[str]]:
    """RoPE with its base (megatron/arguments.py --rotary-position-embeddings-theta, type=int, default 10000)."""
    if model.position != "rope":
        return [], []
    notes = [] if model.rope_scaling == "none" else [
        f"RoPE scaling {model.rope_scaling} (factor {model.rope_scaling_factor:g}): Megatron-DeepSpeed's "
        "RotaryEmbedding has none; exported unscaled"]
    return [("--use-rotary-position-embeddings", None), ("--no-position-embedding", None),
            ("--rotary-position-embeddings-theta", int(round(model.rope_theta)))], notes


def _llama_args(model: ModelSpec, plan: Plan, notes: list[str]) -> Args:
    """What examples_deepspeed/pretrain_llama2_distributed.sh (f4157bea) calls "required for llama model": no
    query-key layer scaling and dropout 0 (megatron/arguments.py defaults: scaling on, dropout 0.1), plus the
    vocabulary padded to exactly the model's rows (megatron/tokenizer/tokenizer.py _vocab_size_with_padding pads
    to a multiple of make_vocab_size_divisible_by * tp, as Megatron-LM does)."""
    vocab, vocab_notes = vocab_args(model, plan)
    notes += vocab_notes
    return [("--no-query-key-layer-scaling", None), ("--attention-dropout", model.dropout),
            ("--hidden-dropout", model.dropout)] + vocab


def _moe_args(model: ModelSpec, plan: Plan, notes: list[str]) -> Args:
    moe = model.decoder.moe
    if moe is None:
        return []
    if moe.n_shared_experts or any(b.layer.moe is None for b in model.blocks):
        notes.append("MoE with shared experts or leading dense layers: Megatron-DeepSpeed places experts every "
                     "--expert-interval layers without shared experts; exported with experts in every layer")
    if plan.etp > 1:
        notes.append(f"etp={plan.etp}: Megatron-DeepSpeed experts are not tensor-parallel on their own degree")
    if (moe.router_score, moe.router_expert_bias, moe.router_groups, moe.router_topk_scale) != ("softmax", False,
                                                                                                0, 1.0):
        notes.append("router: DeepSpeed-MoE's TopKGate (deepspeed/moe/sharded_moe.py) is softmax top-k; the "
                     "model's sigmoid scores, expert bias, group-limited routing or top-k scale are not exported")
    if moe.balance_loss != "aux_loss":
        notes.append(f"balance loss {moe.balance_loss}: DeepSpeed-MoE adds its per-batch l_aux; exported as that")
    # --moe-loss-coeff defaults to 0.1; --create-moe-param-group because DeepSpeed's ZeRO and BF16 optimizers
    # assert "None of the param groups are marked as MoE" otherwise (runtime/zero/stage_1_and_2.py,
    # runtime/bf16_optimizer.py)
    args: Args = [("--num-experts", moe.n_experts), ("--topk", moe.top_k), ("--expert-interval", 1),
                  ("--moe-expert-parallel-size", plan.ep), ("--moe-loss-coeff", moe.aux_loss_coeff),
                  ("--create-moe-param-group", None)]
    if moe.capacity_factor:
        args.append(("--moe-train-capacity-factor", moe.capacity_factor))
    else:
        args.append(("--disable-moe-token-dropping", None))  # dropless; DeepSpeed drops beyond capacity 1.0
    if moe.top_k == 2:
        args.append(("--disable-moe-top2-2nd-expert-sampling", None))  # top2gating samples the 2nd by default
    return args


def _parallel_args(model: ModelSpec, plan: Plan) -> tuple[Args, list[str]]:
    notes: list[str] = []
    args: Args = [("--tensor-model-parallel-size", plan.tp), ("--pipeline-model-parallel-size", plan.pp)]
    if plan.pp == 1:
        args.append(("--no-pipeline-parallel", None))
    if plan.sp and plan.tp > 1:
        args.append(("--sequence-parallel", None))
    if plan.cp > 1:
        args.append(("--ds-sequence-parallel-size", plan.cp))
        if plan.cp_kind == "ring":
            notes.append("ring context parallel: Megatron-DeepSpeed splits sequences with DeepSpeed-Ulysses "
                         "(all-to-all); exported as Ulysses")
    if plan.pp > 1 and not uniform_split(decoder_split(model, plan)):
        notes.append("uneven pipeline split: DeepSpeed's PipelineModule balances layers itself; exported as even")
    name = plan.schedule_name
    if plan.pp > 1 and name == "zb_h1":
        args.append(("--enable-zbh1-pipeline", None))
    elif plan.pp > 1 and name != "1f1b":
        notes.append(f"schedule {name}{f' with vpp={plan.vpp}' if plan.vpp > 1 else ''}: DeepSpeed's pipeline "
                     "engine runs 1F1B on one stage per rank (or ZB-H1); exported as 1F1B")
    return args, notes


def _train_args(plan: Plan, stack: FrameworkProfile) -> Args:
    args: Args = [("--micro-batch-size", plan.micro_batch), ("--global-batch-size", plan.global_batch)]
    args += {"bf16": [("--bf16", None)], "fp8": [("--bf16", None)], "fp16": [("--fp16", None)],
             "fp32": []}[plan.precision]
    if plan.recompute == "full":
        args += [("--checkpoint-activations", None), ("--deepspeed-activation-checkpointing", None)]
    elif plan.recompute == "selective":
        args.append(("--recompute-granularity", "selective"))
    if stack.flash_attention:
        # Megatron-DeepSpeed runs unfused attention unless asked (megatron/arguments.py --use-flash-attn-v2).
        args.append(("--use-flash-attn-v2", None))
    return args + [("--deepspeed", None), ("--deepspeed_config", "${DS_CONFIG}"), ("--zero-stage", plan.zero)]


def mds_args(model: ModelSpec, plan: Plan, stack: FrameworkProfile) -> tuple[Args, list[str]]:
    """Megatron-DeepSpeed pretrain_gpt.py arguments and their approximations."""
    margs, n1 = _model_args(model, plan)
    pargs, n2 = _parallel_args(model, plan)
    n3 = [] if plan.recompute != "selective" or stack.selective_policy == "attention" else [
        f"selective recompute, policy {stack.selective_policy}: Megatron-DeepSpeed recomputes only the attention "
        "core; exported as that"]
    if mtp_depth(model):
        n3.append(f"{mtp_depth(model)} multi-token-prediction module(s): Megatron-DeepSpeed has none; exported "
                  "without them")
    return margs + pargs + _train_args(plan, stack), n1 + n2 + n3


class DeepSpeedExporter:
    """``meshplan export --to deepspeed``: a bash file that writes ds_config.json and defines MDS_ARGS."""

    name = "deepspeed"
    stacks = ("megatron-deepspeed", "deepspeed-2021")
    formats = ("sh",)
    description = "DeepSpeed JSON config plus Megatron-DeepSpeed launch arguments (bash)"

    def target(self, fmt: str) -> str:
        """Megatron-DeepSpeed's last main commit in the mirror and the DeepSpeed whose DeepSpeedConfig the tests
        parse the JSON with (DeepSpeed reads unknown top-level keys silently but validates its sections, so the
        release is said here, not in the JSON)."""
        return "Megatron-DeepSpeed f4157bea (2024-12-24) pretrain_gpt.py with DeepSpeed 0.19.8"

    def suffix(self, fmt: str) -> str:
        """Bash script."""
        return ".sh"

    def render(self, model: ModelSpec, plan: Plan, stack: FrameworkProfile, *, gpus: str = "",
               fmt: str = "") -> ExportResult:
        """The script text."""
        cfg, n1 = ds_config(plan, stack)
        args, n2 = mds_args(model, plan, stack)
        notes = tuple(n1 + n2)
        head = header_lines(framework="DeepSpeed", target=self.target(fmt), model=model, plan=plan, gpus=gpus,
                            approximations=notes)
        head += ["source this file, then: deepspeed --num_nodes $NNODES --num_gpus $GPUS_PER_NODE \\",
                 '    pretrain_gpt.py "${MDS_ARGS[@]}" --tokenizer-type ... --data-path ... --lr ...']
        text = "\n".join(["#!/usr/bin/env bash", comment_block(head), 'DS_CONFIG="${DS_CONFIG:-ds_config.json}"',
                          "cat > \"$DS_CONFIG\" <<'JSON'", json.dumps(cfg, indent=2), "JSON",
                          "MDS_ARGS=(", *format_args(args), ")", ""])
        return ExportResult(text=text, approximations=notes)
