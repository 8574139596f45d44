"""Where a training job's persistent state lives under a plan: every parameter tensor of the model, each state
kind kept for it (16-bit weights, fp32 master, Adam moments) and, for every rank of the plan, the box of that
tensor it holds, as fractions of the tensor's dims.

This is DynaTrain's virtual parameter space (arXiv 2605.18815 sec. 3; ElasticMegatron
``resharding/virtual_param.py``) and DCP's chunk metadata (torch 2.13 ``checkpoint/planner_helpers.py``) in one
vectorised form: a layout is a grid over (layer slots, experts, rows, cols), so a transition between two layouts
is an intersection of boxes, computed for all ranks at once with numpy. Sharding follows the runtime and
Megatron-Core: tensor parallelism splits a column-parallel weight's output dim (rows) and a row-parallel one's
input dim (cols) (Shoeybi et al. 2019 sec. 3); ZeRO/FSDP split the tensor-parallel shard's dim 0 over the ZeRO
group (FSDP2 ``Shard(0)`` / ``_StridedShard``; Megatron's distributed optimizer shards each gradient bucket
evenly over dp x cp, taken here with one bucket per tensor); experts split by expert index over ep and by FFN
width over etp (``runtime/build.py::expert_mesh``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from meshplan.cost.memory import bytes_per_param
from meshplan.spec.checks import layer_split
from meshplan.spec.framework import FrameworkProfile
from meshplan.spec.model import LayerSpec, ModelSpec
from meshplan.spec.plan import Plan
from meshplan.spec.schedules import rank_stages

NEVER = 99
"""ZeRO stage of a state kind that no ZeRO stage shards."""


@dataclass(frozen=True, kw_only=True)
class StateTensor:
    """One parameter tensor, repeated once per layer slot in [slot_lo, slot_hi)."""

    name: str
    """Block and role, e.g. ``decoder.qkv``."""
    elems: float
    """Elements of one copy (all experts together for expert tensors)."""
    tp_dim: int | None
    """Dim tensor parallelism splits: 0 (rows, column-parallel), 1 (cols, row-parallel), None (replicated)."""
    expert: bool
    """Routed-expert weights (split over ep by expert, over etp by FFN width)."""
    slot_lo: int
    """First layer slot (0 = the input embedding, 1..L the decoder layers, L+1 the output head)."""
    slot_hi: int
    """One past the last slot."""
    pieces: float = 1.0
    """Separately stored tensors it stands for per slot (all experts together for expert tensors)."""
    tp_max: int = 0
    """Most tensor-parallel shards it splits into (0 = no limit): GQA's k and v split by kv head, so under
    tp > n_kv_heads each kv head is replicated over tp / n_kv_heads ranks (Megatron-Core, vLLM)."""


@dataclass(frozen=True, kw_only=True)
class StateKind:
    """One kind of per-parameter state."""

    name: str
    """``w16`` (16-bit compute weights), ``master`` (fp32 weights) or ``moments`` (Adam m and v)."""
    bytes: float
    """Bytes per parameter."""
    zero_stage: int
    """Smallest ZeRO stage that shards it (NEVER: replicated over dp whatever the stage)."""


def state_kinds(plan: Plan, stack: FrameworkProfile) -> tuple[StateKind, ...]:
    """The state kinds a plan keeps between steps, with the bytes of ``cost.memory.bytes_per_param`` (ZeRO paper
    sec. 3.1: 2 B weights + 12 B optimizer; FSDP2 and fp32 training keep fp32 weights as the master, sharded from
    stage 3). A stack that runs FSDP2 at every ZeRO level keeps only the fp32 sharded parameters and the moments
    between steps (its 16-bit copy exists while a unit is gathered, which the memory model counts at the peak)."""
    w, _, o = bytes_per_param(plan, stack)
    if stack.sharding == "fsdp2":  # fully_shard at every ZeRO level: fp32 sharded parameters are the master
        moments = 4.0 if stack.optimizer_dtype == "bf16" else 8.0
        return (StateKind(name="master", bytes=4.0, zero_stage=0), StateKind(name="moments", bytes=moments,
                                                                             zero_stage=0))
    if plan.precision == "fp32" or plan.zero == 3:
        return (StateKind(name="master", bytes=w, zero_stage=3), StateKind(name="moments", bytes=o, zero_stage=1))
    return (StateKind(name="w16", bytes=w, zero_stage=NEVER), StateKind(name="master", bytes=4.0, zero_stage=1),
            StateKind(name="moments", bytes=o - 4.0, zero_stage=1))


def _layer_tensors(layer: LayerSpec) -> list[tuple]:
    """(role, elements, tp dim, expert, pieces[, tp_max]) of one layer's tensors; the elements sum to
    ``cost.memory.layer_params``; pieces: the separately stored tensors each stands for in a Hugging Face
    checkpoint, the unit a reshard copies and a generation engine loads (q, k, v apart; gate and up apart; one
    triple per expert)."""
    h, out = layer.hidden, []
    att = layer.attention
    if att is not None:
        if att.kind == "mla":  # Megatron MLA: down-projections replicated over tp, up-projections column-parallel
            if att.q_lora_rank:
                out += [("q_down", h * att.q_lora_rank, None, False, 2),
                        ("q_up", att.q_lora_rank * att.n_heads * att.qk_dim, 0, False, 1)]
            else:
                out.append(("q", h * att.n_heads * att.qk_dim, 0, False, 1))
            out += [("kv_down", h * (att.kv_lora_rank + att.qk_rope_head_dim), None, False, 2),
                    ("kv_up", att.kv_lora_rank * att.n_heads * (att.head_dim + att.v_dim), 0, False, 1)]
        else:
            out += [("q", h * att.n_heads * att.head_dim, 0, False, 1),
                    ("kv", h * 2 * att.n_kv_heads * att.head_dim, 0, False, 2, att.n_kv_heads)]
        out += [("proj", att.n_heads * att.v_dim * h, 1, False, 1), ("norm1", 2 * h, None, False, 1)]
    if layer.in_hidden and layer.in_hidden != h:
        out.append(("in_proj", layer.in_hidden * h, None, False, 1))
    mats = 3 if layer.gated else 2
    if layer.moe is not None:
        moe = layer.moe
        shared = h * moe.shared_width * moe.n_shared_experts
        per = moe.n_experts * h * moe.expert_ffn_hidden
        out += [("router", h * moe.n_experts, None, False, 1),
                ("shared_up", (mats - 1) * shared, 0, False, mats - 1), ("shared_down", shared, 1, False, 1),
                ("experts_up", (mats - 1) * per, 0, True, (mats - 1) * moe.n_experts),
                ("experts_down", per, 1, True, moe.n_experts)]
    else:
        out += [("ffn_up", (mats - 1) * h * layer.ffn_hidden, 0, False, mats - 1),
                ("ffn_down", h * layer.ffn_hidden, 1, False, 1)]
    out.append(("norm2", 2 * h, None, False, 1))
    if layer.bias:
        out.append(("bias", 4 * h + layer.ffn_hidden, None, False, 4))
    return [t for t in out if t[1] > 0]


@lru_cache(maxsize=64)
def state_tensors(model: ModelSpec) -> tuple[StateTensor, ...]:
    """Every parameter tensor of the model over the slot space: embedding at slot 0, the decoder layers in order,
    the output head at slot L+1 (absent when tied: the embedding serves both)."""
    out = [StateTensor(name="embedding", elems=model.vocab * model.hidden, tp_dim=0, expert=False, slot_lo=0,
                       slot_hi=1)]
    slot = 1
    for block in model.blocks:
        for role, elems, dim, expert, pieces, *limit in _layer_tensors(block.layer):
            out.append(StateTensor(name=f"{block.name}.{role}", elems=elems, tp_dim=dim, expert=expert,
                                   slot_lo=slot, slot_hi=slot + block.n_layers, pieces=pieces,
                                   tp_max=limit[0] if limit else 0))
        slot += block.n_layers
    if not model.tied_embeddings:
        out.append(StateTensor(name="head", elems=model.vocab * model.hidden, tp_dim=0, expert=False, slot_lo=slot,
                               slot_hi=slot + 1))
    return tuple(out)


@lru_cache(maxsize=64)
def state_groups(model: ModelSpec) -> tuple[StateTensor, ...]:
    """The tensors merged where they shard alike (same slots, tp dim and expert flag): every box and every
    overlap is the same for them, so a transition sums their elements once (exact, and half the work)."""
    groups: dict = {}
    for t in state_tensors(model):
        key = (t.slot_lo, t.slot_hi, t.tp_dim, t.expert, t.tp_max)
        if key in groups:
            g = groups[key]
            groups[key] = StateTensor(name=f"{g.name}+{t.name.split('.')[-1]}", elems=g.elems + t.elems,
                                      tp_dim=t.tp_dim, expert=t.expert, slot_lo=t.slot_lo, slot_hi=t.slot_hi,
                                      pieces=g.pieces + t.pieces, tp_max=t.tp_max)
        else:
            groups[key] = t
    return tuple(groups.values())


def _digits(plan: Plan, ranks: np.ndarray) -> dict[str, np.ndarray]:
    """Mesh coordinates of logical ranks: mixed radix over ``plan.rank_order`` (fastest first), dp split into
    (dp_shard fast, dp_replicate slow) as ``runtime/mesh.py`` builds it."""
    sizes = {"tp": plan.tp, "cp": plan.cp, "dp": plan.dp, "pp": plan.pp, "ep": 1}
    out, rem = {}, ranks.copy()
    for axis in plan.rank_order.split("-"):
        out[axis], rem = rem % sizes[axis], rem // sizes[axis]
    out["dp_shard"], out["dp_replicate"] = out["dp"] % plan.shard_group, out["dp"] // plan.shard_group
    return out


@dataclass(frozen=True, kw_only=True)
class Geometry:
    """A plan's state placement for all its logical ranks (arrays indexed by logical rank)."""

    plan: Plan
    """The layout."""
    kinds: tuple[StateKind, ...]
    """State kinds it keeps."""
    pp: np.ndarray
    """Pipeline coordinate."""
    ranges: np.ndarray
    """[pp, chunks, 2] slot ranges each pipeline rank holds."""
    tp: np.ndarray
    """Tensor-parallel coordinate."""
    zero: np.ndarray
    """Index in the dense ZeRO group (dp_shard x cp, ``Plan.zero_group``)."""
    zero_n: int
    """Ranks of the dense ZeRO group (under FSDP2 at every ZeRO level: dp_shard x cp even for zero 0)."""
    ezero_n: int
    """Ranks of the experts' ZeRO group (1 when the stack shards experts by ep only)."""
    shards_experts: bool = True
    """The stack's ZeRO shards experts over their expert-data-parallel group; when not, experts without expert
    parallelism are sharded like any parameter (FSDP leaves out only the ep-sharded ones)."""
    ep: np.ndarray
    """Expert-parallel coordinate."""
    etp: np.ndarray
    """Experts' tensor-parallel coordinate."""
    ezero: np.ndarray
    """Index in the experts' ZeRO group (``Plan.expert_zero_group``)."""
    separate: bool = False
    """A copy in another engine's memory (a generation engine's weights): every tensor is copied in, the part
    the GPU already holds from device memory."""
    memo: dict = field(default_factory=dict, compare=False, repr=False)
    """Boxes computed so far, by (tensor slots, tp dim, expert, kind)."""

    @property
    def n_ranks(self) -> int:
        """Ranks of the layout."""
        return int(self.pp.shape[0])

    def kind(self, name: str) -> StateKind | None:
        """The state kind called ``name``, or None when the plan keeps none."""
        return next((k for k in self.kinds if k.name == name), None)


def _ranges(model: ModelSpec, plan: Plan) -> np.ndarray:
    split = layer_split(model, plan)
    starts = np.concatenate([[0], np.cumsum(split)]) + 1
    lo, hi = starts[:-1].copy(), starts[1:].copy()
    lo[0], hi[-1] = 0, hi[-1] + 1  # the embedding rides with the first stage, the head with the last
    held = rank_stages(plan.schedule_name, pp=plan.pp, n_stages=plan.n_stages)
    width = max(len(s) for s in held)
    out = np.zeros((plan.pp, width, 2), dtype=np.int64)
    for p, stages in enumerate(held):
        for c, s in enumerate(stages):
            out[p, c] = (lo[s], hi[s])
    return out


def geometry(model: ModelSpec, plan: Plan, stack: FrameworkProfile) -> Geometry:
    """Coordinates of every logical rank of ``plan`` (Megatron's expert layout: within a stage, ranks in rank
    order are cut into (expert replica, ep, etp) with etp fastest, tp moved innermost when etp = tp)."""
    r = np.arange(plan.n_gpus, dtype=np.int64)
    d = _digits(plan, r)
    order = [a for a in plan.rank_order.split("-") if a not in ("pp", "ep")]
    zero_axes = [("dp_shard", plan.shard_group) if a == "dp" else (a, plan.cp) for a in order if a in ("dp", "cp")]
    zero, stride = np.zeros_like(r), 1
    for axis, size in zero_axes:
        zero, stride = zero + d[axis] * stride, stride * size
    local_axes = [("tp", plan.tp)] if plan.etp > 1 else []
    for a in order:
        if a == "dp":
            local_axes += [("dp_shard", plan.shard_group), ("dp_replicate", plan.dp_replicate)]
        elif a == "cp" or (a == "tp" and plan.etp == 1):
            local_axes.append((a, plan.cp if a == "cp" else plan.tp))
    q, stride = np.zeros_like(r), 1
    for axis, size in local_axes:
        q, stride = q + d[axis] * stride, stride * size
    fsdp_always = stack.sharding == "fsdp2"
    zero_n = plan.shard_group * plan.cp if fsdp_always else plan.zero_group
    ezero_n = plan.expert_zero_group if stack.shards_experts else 1
    return Geometry(plan=plan, kinds=state_kinds(plan, stack), pp=d["pp"], ranges=_ranges(model, plan), tp=d["tp"],
                    zero=zero if zero_n > 1 else np.zeros_like(r), zero_n=zero_n, ezero_n=ezero_n,
                    shards_experts=stack.shards_experts,
                    ep=(q // plan.etp) % plan.ep, etp=q % plan.etp, ezero=(q // (plan.etp * plan.ep)) % ezero_n)


@dataclass(frozen=True)
class Boxes:
    """One tensor's state box on a set of ranks: fractions of (experts, rows, cols), ``lo``/``hi`` of shape [3, n],
    and an integer key that is equal exactly when two ranks hold the same box."""

    lo: np.ndarray
    hi: np.ndarray
    key: np.ndarray

    def area(self) -> np.ndarray:
        """Fraction of the tensor (per slot) each rank holds."""
        return np.prod(self.hi - self.lo, axis=0)

    def take(self, idx: np.ndarray, *, keys: bool = True) -> "Boxes":
        """The boxes of ranks ``idx`` (without their keys when ``keys`` is False: overlaps do not read them)."""
        return Boxes(np.take(self.lo, idx, axis=1), np.take(self.hi, idx, axis=1),
                     np.take(self.key, idx) if keys else self.key[:0])

    @property
    def experts(self) -> np.ndarray:
        """Fraction of the experts each box covers."""
        return self.hi[0] - self.lo[0]


def overlap_area(a: Boxes, b: Boxes) -> np.ndarray:
    """Fraction of the tensor two boxes share (elementwise over ranks)."""
    return np.prod(np.clip(np.minimum(a.hi, b.hi) - np.maximum(a.lo, b.lo), 0.0, None), axis=0)


def boxes(g: Geometry, t: StateTensor, kind: StateKind) -> Boxes:
    """Box of tensor ``t``'s state ``kind`` on every logical rank of ``g`` (memoised on the geometry)."""
    key = (t.slot_lo, t.tp_dim, t.expert, t.tp_max, g.plan.zero >= kind.zero_stage)  # what _boxes reads of kind
    if key not in g.memo:
        g.memo[key] = _boxes(g, t, kind)
    return g.memo[key]


def split_limit(g: Geometry, t: StateTensor) -> int:
    """The tensor's shard limit where it binds under ``g`` (GQA's kv heads under tp > n_kv), else 0: tensors
    whose split dim, experts and binding limit agree have the same boxes."""
    parts = g.plan.etp if t.expert else g.plan.tp
    return t.tp_max if t.tp_max and parts > t.tp_max and parts % t.tp_max == 0 else 0


def _boxes(g: Geometry, t: StateTensor, kind: StateKind) -> Boxes:
    plan, n = g.plan, g.n_ranks
    lo, hi = np.zeros((3, n)), np.ones((3, n))
    parts, idx = (plan.etp, g.etp) if t.expert else (plan.tp, g.tp)
    if split_limit(g, t):
        parts, idx = t.tp_max, idx // (parts // t.tp_max)
    if t.expert:
        lo[0], hi[0] = g.ep / plan.ep, (g.ep + 1) / plan.ep
    if t.tp_dim is not None and parts > 1:
        lo[1 + t.tp_dim], hi[1 + t.tp_dim] = idx / parts, (idx + 1) / parts
    expert_groups = t.expert and (g.shards_experts or plan.ep * plan.etp > 1)
    zn, zi = (g.ezero_n, g.ezero) if expert_groups else (g.zero_n, g.zero)
    sharded = plan.zero >= kind.zero_stage and zn > 1
    if sharded:
        w = (hi[1] - lo[1]) / zn
        lo[1], hi[1] = lo[1] + zi * w, lo[1] + (zi + 1) * w
    key = g.pp.copy()
    for used, size, val in ((t.expert, plan.ep, g.ep), (t.tp_dim is not None, parts, idx), (sharded, zn, zi)):
        if used:
            key = key * size + val
    return Boxes(lo, hi, key)


def slots_held(g: Geometry, t: StateTensor, ranks: np.ndarray) -> np.ndarray:
    """Copies of tensor ``t`` (layer slots) each of ``ranks`` holds under ``g``."""
    r = g.ranges
    per_pp = np.clip(np.minimum(r[..., 1], t.slot_hi) - np.maximum(r[..., 0], t.slot_lo), 0, None).sum(axis=-1)
    return per_pp[g.pp[ranks]]


def common_table(ga: Geometry, gb: Geometry, t: StateTensor) -> np.ndarray:
    """[pp of ga, pp of gb]: slots of ``t`` both pipeline ranks hold (what two ranks share depends only on their
    pipeline coordinates)."""
    a = ga.ranges[:, None, :, None, :]
    b = gb.ranges[None, :, None, :, :]
    lo = np.maximum(np.maximum(a[..., 0], b[..., 0]), t.slot_lo)
    hi = np.minimum(np.minimum(a[..., 1], b[..., 1]), t.slot_hi)
    return np.clip(hi - lo, 0, None).sum(axis=(2, 3))


def slots_common(ga: Geometry, ra: np.ndarray, gb: Geometry, rb: np.ndarray, t: StateTensor) -> np.ndarray:
    """Slots of tensor ``t`` that rank ra[i] holds under ``ga`` and rank rb[i] holds under ``gb``."""
    return common_table(ga, gb, t)[ga.pp[ra], gb.pp[rb]]


def resident_bytes(g: Geometry, tensors: tuple[StateTensor, ...]) -> np.ndarray:
    """Persistent state bytes (weights and optimizer) on every logical rank."""
    ranks = np.arange(g.n_ranks)
    out = np.zeros(g.n_ranks)
    for t in tensors:
        n = slots_held(g, t, ranks)
        for k in g.kinds:
            out += n * boxes(g, t, k).area() * t.elems * k.bytes
    return out


def weights_only(g: Geometry) -> Geometry:
    """The layout holding only 16-bit weights (a generation engine's copy in RL: NeMo-RL's refit moves weights,
    never optimizer state)."""
    from dataclasses import replace

    return replace(g, memo={}, kinds=(StateKind(name="w16", bytes=2.0, zero_stage=NEVER),), separate=True)
