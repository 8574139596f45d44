"""The software-stack spec: what a training framework does that the parallel layout does not say.

A ``Plan`` says *how* a model is laid out (degrees, schedule, recompute mode); a ``FrameworkProfile`` says *with
what software* it runs: whether elementwise ops are fused, which attention kernel, how ZeRO/FSDP is implemented
and what it overlaps, the selective-recompute policy, the optimizer's kernels and precision. Presets are catalog
files (``catalog/frameworks/*.toml``), each field citing the public source it comes from; ``meshplan`` is this
project's own runtime, which ``meshplan run`` is.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from meshplan.errors import SpecError
from meshplan.spec.plan import DP_SYNCS

KERNEL_LIBRARIES = ("nvidia", "pytorch")
SHARDINGS = ("none", "megatron_dist_opt", "fsdp2", "fsdp1", "deepspeed_zero")
ZERO_GATHERS = ("unit", "param")
SELECTIVE_POLICIES = ("attention", "op", "mla_up_proj")
STATE_DTYPES = ("fp32", "bf16")
MICRO_BATCH_DEFAULTS = ("one", "pp_stages")
FP8_LINEARS = ("te", "torchao", "none")
RECOMPUTE_MODES = ("none", "selective", "full")
CP_KINDS = ("ring", "a2a")
LOSS_KERNELS = ("fused", "eager_fp32")

BEHAVIOUR_FIELDS = ("kernel_library", "fused_kernels", "eager_dtensor", "flash_attention", "sharding", "zero_gather",
                    "overlap_grad_reduce", "overlap_param_gather", "accumulate_unsharded_grads", "tp_comm_overlap",
                    "tp_comm_overlap_supported", "selective_policy", "fused_optimizer", "grad_dtype",
                    "optimizer_dtype", "default_micro_batch", "shards_experts", "fp8_linear", "fp8_params",
                    "fp8_fsdp_gather", "cp_step_bytes", "cp_repeats_kv", "tp_backward_async", "loss_kernel")
"""The fields that change a prediction (a recipe or a CLI flag may override them); the rest describe the preset."""
CAPABILITY_FIELDS = ("tensor_parallel", "context_parallel", "expert_parallel", "schedules", "max_zero_with_pp",
                     "recompute_modes", "dp_syncs")
"""What layouts the stack can run at all: the search stays inside them and a plan outside them is refused."""


@dataclass(frozen=True, kw_only=True)
class FrameworkProfile:
    """A training stack's behaviour, as its public code and documentation show it."""

    name: str
    """Preset name (``megatron-core``, ``torchtitan``, ``meshplan``...); a plan names its stack by it."""
    stacks: tuple[str, ...] = ()
    """Names of the stack as sources give them (the validation CSV's ``framework`` column) that this preset
    describes."""
    versions: tuple[str, ...] = ()
    """Version prefixes (``framework_version``) this preset describes; empty = the stack's default preset."""
    default: bool = False
    """The preset for its ``stacks`` when no version matches."""
    summary: str = ""
    """One line: which stack, which era."""
    kernel_library: str = "nvidia"
    """Whose kernels run GEMMs and attention: ``nvidia`` (Megatron, Transformer Engine and apex fused kernels,
    cuDNN attention) or ``pytorch`` (ATen and torch's scaled_dot_product_attention, eager or compiled); the
    calibration may hold constants per library where the fitted runs show them."""
    fused_kernels: bool = True
    """Elementwise ops (norms, activation, RoPE, residuals) run fused (Megatron/TE kernels or torch.compile);
    False = eager PyTorch, op by op."""
    eager_dtensor: bool = False
    """The model runs as eager PyTorch modules with DTensor tensor parallelism, FSDP2 and torch's loss: autograd
    keeps what eager PyTorch keeps (repeated kv heads, SiLU outputs, fp32 RoPE tables, the all-gathered input of
    a ColwiseParallel linear, a replicated embedding gradient, unfused cross-entropy temporaries)."""
    loss_kernel: str = "fused"
    """How the cross-entropy runs: ``fused`` (Megatron's vocab-parallel cross-entropy or another fused kernel:
    16-bit logits and the fp32 softmax it keeps) or ``eager_fp32`` (torch ``F.cross_entropy`` on logits cast to
    fp32: the saved log-softmax, its gradient and the input gradient at once; more under ``loss_parallel``)."""
    flash_attention: bool = True
    """Attention runs as one fused flash kernel (Dao et al. 2022); False = separate QK^T, softmax and AV kernels
    that materialize the score matrix."""
    sharding: str = "megatron_dist_opt"
    """How ZeRO is implemented: ``none`` (plain data parallelism only), ``megatron_dist_opt`` (Megatron's
    distributed optimizer, persistent gradient buffers), ``fsdp2`` (torch ``fully_shard`` at every ZeRO level,
    gradients freed between steps), ``fsdp1`` (torch ``FullyShardedDataParallel`` with flat parameters) or
    ``deepspeed_zero``."""
    shards_experts: bool = True
    """ZeRO/FSDP also shards routed experts over their expert-data-parallel group (Megatron's distributed
    optimizer, torchtitan's FSDP over dp_shard_mod_ep); False = experts are sharded by ep only and replicated
    over their expert-data-parallel ranks."""
    zero_gather: str = "unit"
    """How ZeRO-3 moves parameters: ``unit`` (one all-gather and one reduce-scatter per layer: FSDP units,
    Megatron buckets, DeepSpeed's coalesced gathers) or ``param`` (one per parameter tensor, each paying the
    collective's latency: DeepSpeed ZeRO-3 as released in 2021)."""
    overlap_grad_reduce: bool = True
    """The gradient reduction overlaps the backward pass."""
    overlap_param_gather: bool = True
    """ZeRO/FSDP parameter all-gathers overlap compute (prefetch)."""
    accumulate_unsharded_grads: bool = False
    """Gradient sync is skipped over accumulation micro-batches until the last one (Megatron's ``no_sync_func``,
    FSDP2's ``set_requires_gradient_sync(False)``), so unsharded gradients accumulate; False = reduce-scattered
    every micro-batch. The memory model applies it under FSDP2 sharding, whose ZeRO-3 gradients then stay unsharded
    until the last micro-batch."""
    tp_comm_overlap: bool = False
    """TP collectives overlap GEMMs (Megatron/TE userbuffers ``--tp-comm-overlap``, torch async-TP)."""
    tp_comm_overlap_supported: bool = False
    """The stack can overlap TP communication at all (a plan may switch it on)."""
    tp_backward_async: bool = False
    """Without TP overlap, the column-parallel layers' backward collectives still run beside their GEMMs: with
    SP the re-gather of the saved input beside the input-gradient GEMM and the input gradient's reduce-scatter
    beside the weight-gradient GEMM (only the output gradient's gather waits); without SP the input gradient's
    all-reduce beside the weight-gradient GEMM. False = every backward collective blocks."""
    selective_policy: str = "attention"
    """What ``recompute = "selective"`` recomputes: ``attention`` (Megatron: the attention core), ``op``
    (torchtitan's per-op policy: every other matmul and all elementwise ops; attention outputs kept) or
    ``mla_up_proj`` (Megatron ``recompute_modules=["mla_up_proj"]``: MLA's up-projections and RoPE)."""
    fused_optimizer: bool = True
    """The optimizer step runs as multi-tensor kernels (apex/TE FusedAdam, torch AdamW ``foreach``/``fused``);
    False = torch's per-tensor loop, a dozen launches per parameter tensor."""
    grad_dtype: str = "fp32"
    """Gradient buffers, accumulated over micro-batches and reduced: ``fp32`` (Megatron's main_grad, FSDP2's
    reduce dtype) or ``bf16`` (Megatron ``--main-grads-dtype bf16``); fp16 training always keeps 16-bit
    gradients."""
    optimizer_dtype: str = "fp32"
    """Adam's two moments: ``fp32``, or ``bf16`` (Megatron's precision-aware optimizer). Master weights stay
    fp32."""
    fp8_linear: str = "none"
    """What runs an fp8 plan's linear layers: ``te`` (Transformer Engine: inputs saved for the weight gradient in
    fp8, a separate fp8 copy of the attention output, an fp8 weight workspace beside 16-bit weights, transposed on
    Hopper), ``torchao`` (Float8Linear: 16-bit inputs saved, weights cast at each use) or ``none`` (no fp8
    path; memory as in 16 bits)."""
    fp8_params: bool = False
    """fp8 plans keep the model's weights in fp8 and all-gather them in fp8 (Megatron ``--fp8-param-gather``,
    TE ``fp8_model_init``; the fp32 master stays in the distributed optimizer)."""
    fp8_fsdp_gather: bool = False
    """fp8 plans under FSDP cast each linear weight's shard to fp8 before the all-gather and gather 1 byte per
    weight (torchao ``enable_fsdp_float8_all_gather``: WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather);
    gradients are still reduce-scattered at the reduce dtype."""
    cp_step_bytes: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    """HBM bytes each ring context-parallel step moves outside the attention kernel: merging the step's partial
    output and log-sum-exp into the running result, the copies that feed the next step, the gradient
    accumulation. Averaged over ranks under the causal zig-zag balance (half the steps on half tensors):
    (forward, backward) per element of the rank's attention output, then (forward, backward) per element of its
    K and V chunks."""
    cp_repeats_kv: bool = False
    """The model expands grouped K/V heads to the query heads before attention, so a ring rotates and accumulates
    n_heads-wide K and V (torchtitan's ``repeat_kv`` before SDPA)."""
    default_micro_batch: str = "one"
    """Micro-batch size when a recipe does not say: ``one`` (Megatron: micro-batch 1) or ``pp_stages`` (as many
    micro-batches as pipeline stages, torchtitan's ``pipeline_parallel_microbatches`` default)."""
    tensor_parallel: bool = True
    """The stack has tensor (and sequence) parallelism."""
    context_parallel: tuple[str, ...] = CP_KINDS
    """Context-parallel kinds it runs (``ring``, ``a2a``); empty = none."""
    expert_parallel: bool = True
    """It shards experts over an expert-parallel group."""
    schedules: tuple[str, ...] = ("1f1b", "interleaved_1f1b")
    """Pipeline schedules (registry names) it runs; empty = no pipeline parallelism."""
    max_zero_with_pp: int = 3
    """Highest ZeRO stage it combines with pipeline parallelism (DeepSpeed's pipeline engine: 1)."""
    recompute_modes: tuple[str, ...] = RECOMPUTE_MODES
    """Recompute modes it offers (``none``, ``selective``, ``full``)."""
    dp_syncs: tuple[str, ...] = ("allreduce", "reduce_scatter")
    """How it synchronises data-parallel gradients (``meshplan.spec.plan.DP_SYNCS``): NCCL all-reduce and ZeRO's
    reduce-scatter for the collective stacks, ``ps`` for a parameter server (BytePS)."""
    sources: dict = field(default_factory=dict, compare=False, hash=False)
    """Field name -> the public source of its value (file and version)."""

    def __post_init__(self) -> None:
        if not self.name:
            raise SpecError("framework.name", self.name, "must be a non-empty name")
        for name, opts in (("kernel_library", KERNEL_LIBRARIES), ("sharding", SHARDINGS),
                           ("zero_gather", ZERO_GATHERS), ("selective_policy", SELECTIVE_POLICIES),
                           ("grad_dtype", STATE_DTYPES), ("optimizer_dtype", STATE_DTYPES),
                           ("default_micro_batch", MICRO_BATCH_DEFAULTS), ("fp8_linear", FP8_LINEARS),
                           ("loss_kernel", LOSS_KERNELS)):
            if getattr(self, name) not in opts:
                raise SpecError(f"framework.{name}", getattr(self, name), f"must be one of {', '.join(opts)}")
        for name in ("fused_kernels", "eager_dtensor", "flash_attention", "overlap_grad_reduce",
                     "overlap_param_gather", "accumulate_unsharded_grads", "tp_comm_overlap",
                     "tp_comm_overlap_supported", "fused_optimizer", "shards_experts", "fp8_params",
                     "fp8_fsdp_gather", "cp_repeats_kv", "tp_backward_async"):
            if not isinstance(getattr(self, name), bool):
                raise SpecError(f"framework.{name}", getattr(self, name), "must be true or false")
        for name, opts in (("context_parallel", CP_KINDS), ("recompute_modes", RECOMPUTE_MODES),
                           ("dp_syncs", DP_SYNCS)):
            bad = [v for v in getattr(self, name) if v not in opts]
            if bad:
                raise SpecError(f"framework.{name}", bad, f"entries must be among {', '.join(opts)}")
        step = self.cp_step_bytes
        if len(step) != 4 or not all(isinstance(b, (int, float)) and 0 <= b < 1e3 for b in step):
            raise SpecError("framework.cp_step_bytes", step, "must be four byte counts between 0 and 1000")
        if self.max_zero_with_pp not in (0, 1, 2, 3):
            raise SpecError("framework.max_zero_with_pp", self.max_zero_with_pp, "must be 0, 1, 2 or 3")
        if self.tp_comm_overlap and not self.tp_comm_overlap_supported:
            raise SpecError("framework.tp_comm_overlap", True,
                            f"{self.name} cannot overlap TP communication (tp_comm_overlap_supported = false)")

    def sync_for(self, zero: int) -> str:
        """The ``Plan.dp_sync`` a search gives a leaf of ZeRO stage ``zero`` under this stack: empty when the
        stage's own collective is among ``dp_syncs``, else the parameter server where the stack has one."""
        own = "allreduce" if zero == 0 else "reduce_scatter"
        if own in self.dp_syncs or zero or "ps" not in self.dp_syncs:
            return ""
        return "ps"

    def with_(self, **changes) -> "FrameworkProfile":
        """A copy with some behaviour changed (a recipe's or a flag's), validated again; the name stays."""
        bad = sorted(set(changes) - set(BEHAVIOUR_FIELDS))
        if bad:
            raise SpecError("framework", bad, f"can set only {', '.join(BEHAVIOUR_FIELDS)}")
        return replace(self, **changes)

    def changes_from(self, base: "FrameworkProfile") -> dict:
        """Behaviour fields whose value differs from ``base`` (what a plan file records beside the name)."""
        return {f: getattr(self, f) for f in BEHAVIOUR_FIELDS if getattr(self, f) != getattr(base, f)}

    def behaviour(self) -> dict:
        """Every behaviour field and its value."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name in BEHAVIOUR_FIELDS}
