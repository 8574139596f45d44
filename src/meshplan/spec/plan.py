"""The plan spec: *how* a model is laid out on a cluster, and the workload it is laid out for.

Degrees use one vocabulary everywhere: ``tp, cp, pp, dp, ep`` (``dp = dp_replicate * dp_shard``); exporters
translate to each framework's spelling. Field names follow the columns of the validation CSV.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace

from meshplan.errors import SpecError
from meshplan.spec.schedules import check_schedule_name

RECOMPUTE = ("none", "selective", "full")
PRECISIONS = ("fp32", "bf16", "fp16", "fp8")
PRECISION_SPELLINGS = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32",
                       "float8": "fp8", "fp8_e4m3": "fp8", "fp8-e4m3": "fp8", "e4m3": "fp8", "fp8_e4m3fn": "fp8"}
"""How sources spell the precisions (torch dtype names, the fp8 format's), by this vocabulary's names."""


RECOMPUTE_SPELLINGS = {"no": "none", "off": "none", "false": "none", "0": "none", "disabled": "none",
                      "yes": "full", "on": "full", "true": "full", "1": "full", "uniform": "full", "block": "full",
                      "full recompute": "full", "activation checkpointing": "full",
                      "partial": "selective", "attention": "selective", "core attention": "selective",
                      "selective recompute": "selective", "gradient checkpointing": "full",
                      "gradient_checkpointing": "full", "op": "selective", "sac": "selective",
                      "per-op sac": "selective", "per-op": "selective"}
"""How sources spell the recompute modes (Megatron's ``--recompute-method uniform|block`` is full recompute of
whole layers; a boolean activation checkpointing flag, as Composer's and HF's, is full)."""


def recompute_name(text: str) -> str:
    """A source's recompute mode in this vocabulary (lower case, a parenthesised detail dropped, spellings mapped by
    ``RECOMPUTE_SPELLINGS``); empty stays empty."""
    low = text.strip().lower().split("(", 1)[0].strip()
    return RECOMPUTE_SPELLINGS.get(low, low)


def precision_name(text: str) -> str:
    """A source's precision in this vocabulary: lower case, a parenthesised detail dropped ("FP8 (W8A8)" is fp8,
    "BF16 (mixed)" bf16), torch's and the fp8 format's spellings mapped (``PRECISION_SPELLINGS``)."""
    low = text.strip().lower().split("(", 1)[0].strip()
    low = re.sub(r"^(?:amp_|mixed[ _-])|[ _-]mixed$", "", low)  # Composer's amp_bf16, Lightning's bf16-mixed
    if low.startswith("fp8") or low == "mxfp8":  # fp8-hybrid, FP8-CS, fp8-delayed: scaling recipes of fp8
        return "fp8"
    return PRECISION_SPELLINGS.get(low, low)
CP_KINDS = ("ring", "a2a")
DP_SYNCS = ("allreduce", "reduce_scatter", "ps")
"""How data-parallel replicas synchronise gradients (``meshplan.cost.dp_sync`` prices each)."""
AXES = ("tp", "cp", "ep", "dp", "pp")
DEFAULT_RANK_ORDER = "tp-cp-ep-dp-pp"
DEFAULT_FRAMEWORK = "megatron-core"
"""The stack a plan is predicted for when nobody names one (what ``meshplan export --to megatron`` writes)."""


MAX_COUNT = 2**31
"""Largest batch, sequence length or degree a plan takes: beyond any job (Llama 4's longest context is 10M tokens,
the largest published batches a few tens of millions of tokens), and the search's divisor scans stay short."""


def _check_int(name: str, value: int, lo: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise SpecError(f"plan.{name}", value, f"must be an integer >= {lo}")
    if value > MAX_COUNT:
        raise SpecError(f"plan.{name}", value, f"must be at most {MAX_COUNT:,}")


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A parallel layout plus the workload (global batch, sequence length) it serves."""

    global_batch: int
    """Sequences per optimizer step."""
    seq_len: int
    """Tokens per sequence."""
    micro_batch: int = 1
    """Sequences per micro-batch per data-parallel rank."""
    tp: int = 1
    """Tensor-parallel degree."""
    sp: bool = False
    """Megatron sequence parallelism (norms/dropout sharded over tp; all-gather/reduce-scatter instead of
    all-reduce)."""
    cp: int = 1
    """Context-parallel degree (sequence split across ranks for attention)."""
    cp_kind: str = "ring"
    """``ring`` (ring attention, P2P KV exchange) or ``a2a`` (Ulysses all-to-all over heads)."""
    pp: int = 1
    """Pipeline-parallel degree."""
    vpp: int = 1
    """Model chunks per pipeline rank (virtual stages); > 1 means interleaving."""
    schedule: str = ""
    """Pipeline schedule name from the registry; empty = ``1f1b`` or ``interleaved_1f1b`` when vpp > 1."""
    layer_split: tuple[int, ...] = ()
    """Layers per virtual stage in pipeline order (pp*vpp entries); empty = as even as possible."""
    dp: int = 1
    """Data-parallel degree (replicas x shards)."""
    zero: int = 0
    """0 = DDP, 1 = optimizer states sharded, 2 = + gradients, 3 = + parameters (FSDP)."""
    dp_shard: int = 0
    """Size of the sharding group inside dp (HSDP when < dp with zero 3); 0 = all of dp."""
    ep: int = 1
    """Expert-parallel degree (folded inside dp x cp x tp, Megatron convention)."""
    etp: int = 1
    """Tensor-parallel degree of the experts."""
    recompute: str = "none"
    """Activation recomputation: ``none``, ``selective`` (what the stack's ``selective_policy`` names) or ``full``
    (whole layer)."""
    recompute_layers: int = 0
    """With ``full``: layers per pipeline rank that are recomputed; 0 = all of them."""
    precision: str = "bf16"
    """Compute precision: ``bf16``, ``fp16``, ``fp32``, or ``fp8`` (linear layers only)."""
    rank_order: str = DEFAULT_RANK_ORDER
    """Order of axes from fastest-varying (innermost) to slowest, e.g. ``tp-cp-ep-dp-pp``."""
    framework: str = DEFAULT_FRAMEWORK
    """The software stack that runs the plan: a profile name from ``catalog/frameworks`` (what a stack does that the
    layout does not say: kernel fusion, FSDP flavour, overlap, recompute policy, optimizer precision)."""
    state_copies: int = 0
    """Copies of every optimizer-state shard (fp32 master weights, Adam moments) that survive the loss of any
    ``state_copies`` scale-up domains (nodes), so a failure needs no storage: ZeRO's data-parallel replicas
    count (HSDP's replica groups, zero 0's replicas); what they lack is kept in GPU memory on peers in other
    domains and refreshed after each optimizer step (Gemini, SOSP'23, keeps such copies in peer CPU memory;
    ``shared/notes/elastic.md`` sec. 5.3). 0 = none kept on purpose."""
    dp_sync: str = ""
    """How data-parallel replicas synchronise gradients (``DP_SYNCS``): ``allreduce`` (ring all-reduce),
    ``reduce_scatter`` (ZeRO's reduce-scatter and all-gather), ``ps`` (a sharded parameter server on the cluster's
    CPU server machines, BytePS); empty = the collective the ZeRO stage implies (``sync``)."""
    batch_shares: tuple[int, ...] = ()
    """Mixed clusters: micro-batches per step of each data-parallel replica, per pool in cluster order (every
    replica on pool i runs ``batch_shares[i]``; global_batch = sum_i replicas_i * share_i * micro_batch);
    empty = the same share everywhere (``n_micro``). Needs dp outermost so that each replica lives on one pool."""

    def __post_init__(self) -> None:
        for name in ("global_batch", "seq_len", "micro_batch", "tp", "cp", "pp", "vpp", "dp", "ep", "etp"):
            _check_int(name, getattr(self, name), 1)
        _check_int("recompute_layers", self.recompute_layers, 0)
        _check_int("state_copies", self.state_copies, 0)
        _check_int("dp_shard", self.dp_shard, 0)
        if self.zero not in (0, 1, 2, 3):
            raise SpecError("plan.zero", self.zero, "must be 0, 1, 2 or 3")
        for name, opts in (("recompute", RECOMPUTE), ("precision", PRECISIONS), ("cp_kind", CP_KINDS)):
            if getattr(self, name) not in opts:
                raise SpecError(f"plan.{name}", getattr(self, name), f"must be one of {', '.join(opts)}")
        order = self.rank_order.split("-")
        if sorted(order) != sorted(AXES):
            raise SpecError("plan.rank_order", self.rank_order,
                            f"must be a dash-separated permutation of {', '.join(AXES)}")
        if any(not isinstance(x, int) or isinstance(x, bool) or x < 1 for x in self.batch_shares):
            raise SpecError("plan.batch_shares", self.batch_shares,
                            "micro-batches per replica must be integers >= 1 (leave a pool out to idle it)")
        check_schedule_name(self.schedule)
        if self.dp_sync and self.dp_sync not in DP_SYNCS:
            raise SpecError("plan.dp_sync", self.dp_sync, f"must be one of {', '.join(DP_SYNCS)} (or empty)")
        if self.dp_sync in ("allreduce", "reduce_scatter") and (self.dp_sync == "allreduce") != (self.zero == 0):
            raise SpecError("plan.dp_sync", self.dp_sync, "all-reduce goes with zero 0 and reduce-scatter with zero "
                            f"1-3; this plan has zero {self.zero} (leave dp_sync empty for the stage's own)")
        if self.dp_sync == "ps" and self.zero:
            raise SpecError("plan.dp_sync", self.dp_sync, "a parameter server returns whole summed gradients "
                            f"(BytePS's push-pull): use zero 0, not {self.zero}")
        if not isinstance(self.framework, str) or not self.framework:
            raise SpecError("plan.framework", self.framework, "must name a software-stack profile")
        if self.layer_split and any(x < 0 for x in self.layer_split):
            raise SpecError("plan.layer_split", self.layer_split, "layer counts must be >= 0")
        self._canonicalise()

    def _canonicalise(self) -> None:
        """One spelling per layout: a shard group of all of dp is ``dp_shard = 0``, and ZeRO over a group of one
        rank (``z3/1``: every rank keeps whole states) is replication, ``zero = 0``."""
        if self.dp_shard == self.dp:
            object.__setattr__(self, "dp_shard", 0)
        if self.zero and self.zero_group == 1:
            object.__setattr__(self, "zero", 0)
            object.__setattr__(self, "dp_shard", 0)

    @property
    def sync(self) -> str:
        """The gradient synchronisation, resolving the empty default: all-reduce for zero 0, reduce-scatter and
        all-gather for ZeRO 1-3."""
        return self.dp_sync or ("allreduce" if self.zero == 0 else "reduce_scatter")

    @property
    def act_bytes(self) -> float:
        """Bytes of one activation element: 4 for fp32 training, else 2 (bf16/fp16; fp8 keeps 16-bit
        activations between layers)."""
        return 4.0 if self.precision == "fp32" else 2.0

    @property
    def n_gpus(self) -> int:
        """GPUs the plan occupies: tp * cp * pp * dp."""
        return self.tp * self.cp * self.pp * self.dp

    @property
    def n_micro(self) -> int:
        """Micro-batches per optimizer step per pipeline (gradient accumulation steps)."""
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def shard_group(self) -> int:
        """Ranks that share one copy of whatever ZeRO shards (1 for zero 0)."""
        if self.zero == 0:
            return 1
        return self.dp_shard or self.dp

    @property
    def extra_state_copies(self) -> int:
        """Peer copies of each optimizer-state shard kept beyond the data-parallel replicas that already hold it
        (dp / shard_group - 1 of them) to reach ``state_copies``."""
        return max(self.state_copies - (self.dp // self.shard_group - 1), 0)

    @property
    def zero_group(self) -> int:
        """Ranks that shard one ZeRO/FSDP copy: the shard group with cp folded in (Megatron's distributed
        optimizer uses the dp x cp group; torchtitan applies FSDP on its dp_shard x cp mesh)."""
        return self.shard_group * self.cp if self.zero else 1

    @property
    def expert_dp(self) -> int:
        """Expert-data-parallel degree: the ranks that hold the same expert shard (Megatron MoE layout: ep x etp
        experts groups folded inside tp x cp x dp)."""
        return max(self.tp * self.cp * self.dp // (self.ep * self.etp), 1)

    @property
    def expert_zero_group(self) -> int:
        """Ranks that shard one ZeRO copy of the experts: the expert-data-parallel ranks in the same proportion as
        the dense shard group (HSDP shards experts over expert_dp x dp_shard / dp ranks; 1 for zero 0)."""
        if not self.zero:
            return 1
        return max(1, self.expert_dp * self.shard_group // self.dp)

    @property
    def dp_replicate(self) -> int:
        """Data-parallel replicas (HSDP outer degree)."""
        return self.dp // self.shard_group

    @property
    def schedule_name(self) -> str:
        """The pipeline schedule, resolving the empty default."""
        if self.schedule:
            return self.schedule
        return "interleaved_1f1b" if self.vpp > 1 else "1f1b"

    @property
    def n_stages(self) -> int:
        """Virtual pipeline stages: pp * vpp."""
        return self.pp * self.vpp

    def axis_degree(self, axis: str) -> int:
        """Degree of a mesh axis by name (``ep`` counts inside dp, so it does not multiply n_gpus)."""
        return {"tp": self.tp, "cp": self.cp, "ep": 1, "dp": self.dp, "pp": self.pp}[axis]

    def stride(self, axis: str) -> int:
        """Rank distance between consecutive members of an ``axis`` group under the rank order."""
        s = 1
        for a in self.rank_order.split("-"):
            if a == axis:
                return s
            s *= self.axis_degree(a)
        raise SpecError("axis", axis, f"must be one of {', '.join(AXES)}")

    def with_(self, **changes) -> "Plan":
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    def to_dict(self) -> dict:
        """Plain dict of the fields that differ from the defaults (plus the workload), for files."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in ("global_batch", "seq_len") or v != f.default:
                out[f.name] = list(v) if isinstance(v, tuple) else v
        return out
