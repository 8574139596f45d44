"""Bytes a layout switch moves: for every rank of the new layout, the state it must hold and does not, split by
where it can come from (its own scale-up domain or the fabric), what exists on no surviving rank, what each old
rank sends, and how many peers each rank talks to.

The per-rank accounting is that of the elastic design note (``shared/notes/elastic.md`` sec. 4.2):
in(r) = sum over tensors of |box_B(pi(r)) minus held_A(r)|; a source is one of the old holders of the needed
cell, on the receiver's scale-up domain when one holds it (Alpa's cross-mesh resharding prefers the local copy,
arXiv 2211.05322 sec. 4), else over the NIC; senders share each cell's traffic in proportion to what they hold
(a load-balanced choice of replica, as NeMo-RL's and Alpa's planners make it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from meshplan.cost.state_layout import (
    Boxes,
    Geometry,
    StateKind,
    StateTensor,
    boxes,
    overlap_area,
    slots_common,
    slots_held,
    split_limit,
)


@dataclass(frozen=True)
class Placement:
    """A layout placed on GPUs: ``phys[i]`` is the GPU (an id shared by both sides of a switch) that runs logical
    rank ``i`` of ``geo.plan``."""

    geo: Geometry
    phys: np.ndarray


@dataclass(frozen=True, kw_only=True)
class TransferBytes:
    """Bytes of one switch, per rank (arrays over the new layout's logical ranks unless named per GPU)."""

    need: np.ndarray
    """State bytes each new rank holds after the switch."""
    in_local: np.ndarray
    """Received from the rank's own scale-up domain."""
    in_fabric: np.ndarray
    """Received over the NICs."""
    lost: np.ndarray
    """Needed and held by no surviving GPU: must come from storage (or a redundant copy)."""
    peers: np.ndarray
    """Ranks each new rank receives from."""
    tensors: np.ndarray
    """Tensors (per state kind) each new rank receives some of: what a reshard copies one by one."""
    out_local: np.ndarray
    """Per GPU id: sent inside its scale-up domain."""
    out_fabric: np.ndarray
    """Per GPU id: sent over the NICs."""
    resident_a: np.ndarray
    """Per GPU id: state bytes held before the switch."""
    by_kind: dict = field(default_factory=dict)
    """Moved bytes (live and lost) by state kind name."""

    @property
    def moved(self) -> float:
        """All bytes that travel between GPUs."""
        return float(self.in_local.sum() + self.in_fabric.sum())

    @property
    def total_need(self) -> float:
        """The whole state of the new layout (every copy)."""
        return float(self.need.sum())


def _source_kind(a: Geometry, kind: StateKind) -> StateKind:
    """The old state a new kind is made from: itself, or for 16-bit weights the fp32 master (a local cast)."""
    return a.kind(kind.name) or a.kind("master")


def _cells(a_box: Boxes, b_box: Boxes) -> np.ndarray:
    """Old grid cells one new box crosses (the old boxes tile each dim in cells of equal width)."""
    w = (a_box.hi[:, :1] - a_box.lo[:, :1])
    return np.prod(np.floor((b_box.hi - 1e-12) / w) - np.floor(b_box.lo / w + 1e-12) + 1, axis=0)


def _stages_crossed(a: Geometry, b: Geometry, t: StateTensor) -> np.ndarray:
    """Old pipeline ranks whose slots of ``t`` meet each new rank's."""
    ra = a.ranges[None, :, :, None, :]
    rb = b.ranges[:, None, None, :, :]
    lo = np.maximum(np.maximum(ra[..., 0], rb[..., 0]), t.slot_lo)
    hi = np.minimum(np.minimum(ra[..., 1], rb[..., 1]), t.slot_hi)
    return ((hi - lo) > 0).any(axis=(2, 3)).sum(axis=1)[b.pp]


@dataclass
class _Acc:
    """Running sums over tensors and kinds."""

    nb: int
    universe: int
    need: np.ndarray = None
    local: np.ndarray = None
    fabric: np.ndarray = None
    lost: np.ndarray = None
    peers: np.ndarray = None
    tensors: np.ndarray = None
    out_local: np.ndarray = None
    out_fabric: np.ndarray = None
    by_kind: dict = None

    def __post_init__(self):
        for name in ("need", "local", "fabric", "lost", "peers", "tensors"):
            setattr(self, name, np.zeros(self.nb))
        self.out_local, self.out_fabric = np.zeros(self.universe), np.zeros(self.universe)
        self.by_kind = {}


def _lost(a: Geometry, alive: np.ndarray, t, a_boxes: Boxes, b: Geometry, b_box: Boxes, rb) -> np.ndarray:
    """Fraction of each new box that no surviving old rank holds (cells whose every replica died)."""
    if alive.all():
        return np.zeros(rb.shape[0])
    key = a_boxes.key
    present = np.bincount(key[alive], minlength=int(key.max()) + 1)
    dead = np.unique(key[~alive])
    missing = dead[present[dead] == 0]
    out = np.zeros(rb.shape[0])
    for k in missing:
        rep = np.full(rb.shape[0], int(np.flatnonzero(key == k)[0]))
        out += slots_common(a, rep, b, rb, t) * overlap_area(a_boxes.take(rep), b_box)
    return out


@dataclass(frozen=True)
class _Domain:
    """The old ranks on each new rank's scale-up domain: old logical rank per (slot j, new rank) or -1, and
    their common slots with the new rank for one tensor."""

    ranks: list
    common: list


def _domain(a: Placement, b: Placement, inv: np.ndarray, domain: int, t: StateTensor, rb) -> _Domain:
    first = b.phys[rb] // domain * domain
    ranks, common = [], []
    for j in range(domain):
        s = first + j
        ai = np.where(s < inv.shape[0], inv[np.minimum(s, inv.shape[0] - 1)], -1)
        ranks.append(ai)
        common.append(slots_common(a.geo, np.maximum(ai, 0), b.geo, rb, t))
    return _Domain(ranks, common)


def _domain_supply(dom: _Domain, a_boxes: Boxes, b_box: Boxes, own_key) -> np.ndarray:
    """Fraction of each new box that other old holders on the receiver's scale-up domain can supply (each
    distinct old cell counted once, the receiver's own cell excluded)."""
    supply = np.zeros(b_box.key.shape[0])
    seen = []
    for ai, common in zip(dom.ranks, dom.common):
        ok = ai >= 0
        ai0 = np.maximum(ai, 0)
        key = np.where(ok, a_boxes.key[ai0], -1)
        fresh = ok & (key != own_key)
        for prev in seen:
            fresh &= key != prev
        seen.append(key)
        supply += np.where(fresh, common * overlap_area(a_boxes.take(ai0), b_box), 0.0)
    return supply


def transfer_bytes(a: Placement, b: Placement, *, tensors: tuple[StateTensor, ...], lost_gpus: np.ndarray,
                   domain: int) -> TransferBytes:
    """Per-rank bytes of switching from ``a`` to ``b``; ``lost_gpus``: GPU ids whose state is gone; ``domain``:
    GPUs per scale-up domain (ids ``k*domain .. (k+1)*domain-1`` share one)."""
    universe = int(max(a.phys.max(), b.phys.max())) + 1
    inv = np.full(universe, -1, dtype=np.int64)
    inv[a.phys] = np.arange(a.phys.shape[0])
    inv[lost_gpus] = -1
    rb = np.arange(b.phys.shape[0])
    own = inv[b.phys]
    ctx = _Ctx(a=a, b=b, rb=rb, own=np.maximum(own, 0), valid=own >= 0, alive=inv[a.phys] >= 0, acc=_Acc(
        nb=rb.shape[0], universe=universe))
    resident_a = np.zeros(universe)
    ra = np.arange(a.phys.shape[0])
    for alike in _alike(a.geo, b.geo, tensors):
        t = alike[0]
        ctx.common = slots_common(a.geo, ctx.own, b.geo, rb, t)
        ctx.slots_b = slots_held(b.geo, t, rb)
        ctx.slots_a = slots_held(a.geo, t, ra)
        ctx.dom = _domain(a, b, inv, domain, t, rb)
        ctx.stages = _stages_crossed(a.geo, b.geo, t)
        for kinds in _kind_groups(a.geo, b.geo):
            _one(ctx, alike, kinds)
        elems = sum(x.elems for x in alike)
        for k in a.geo.kinds:
            resident_a[a.phys] += ctx.slots_a * boxes(a.geo, t, k).area() * elems * k.bytes
    acc = ctx.acc
    return TransferBytes(need=acc.need, in_local=acc.local, in_fabric=acc.fabric, lost=acc.lost, peers=acc.peers,
                         tensors=acc.tensors, out_local=acc.out_local, out_fabric=acc.out_fabric, resident_a=resident_a,
                         by_kind=acc.by_kind)


@dataclass
class _Ctx:
    """What every (tensor, kind) of one switch shares."""

    a: Placement
    b: Placement
    rb: np.ndarray
    own: np.ndarray
    valid: np.ndarray
    alive: np.ndarray
    acc: _Acc
    common: np.ndarray = None
    slots_a: np.ndarray = None
    slots_b: np.ndarray = None
    dom: _Domain = None
    stages: np.ndarray = None


def _alike(a: Geometry, b: Geometry, tensors: tuple[StateTensor, ...]) -> list[list[StateTensor]]:
    """Tensors with the same layer slots that split alike under both layouts: every per-rank fraction of theirs
    is the same, so they are summed once, weighted by their elements."""
    groups: dict[tuple, list[StateTensor]] = {}
    for t in tensors:
        key = (t.slot_lo, t.slot_hi, t.tp_dim, t.expert, split_limit(a, t), split_limit(b, t))
        groups.setdefault(key, []).append(t)
    return list(groups.values())


def _kind_groups(a: Geometry, b: Geometry) -> list[list[StateKind]]:
    """The new layout's state kinds that share a box and a source box (a box depends only on the ZeRO stage)."""
    groups: dict[tuple, list[StateKind]] = {}
    for kb in b.kinds:
        groups.setdefault((kb.zero_stage, _source_kind(a, kb).zero_stage), []).append(kb)
    return list(groups.values())


def _one(ctx: _Ctx, ts: list[StateTensor], kbs: list[StateKind]) -> None:
    """Add tensors that split alike, in state kinds that shard alike, to the sums."""
    a, b, acc = ctx.a, ctx.b, ctx.acc
    t, kb = ts[0], kbs[0]
    ka = _source_kind(a.geo, kb)
    elems = sum(x.elems for x in ts)
    scale = elems * sum(k.bytes for k in kbs)
    b_box = boxes(b.geo, t, kb)
    need = ctx.slots_b * b_box.area()
    a_boxes = boxes(a.geo, t, ka)
    own_box = a_boxes.take(ctx.own)
    held = np.where(ctx.valid, ctx.common * overlap_area(own_box, b_box), 0.0)
    want = np.clip(need - held, 0.0, None)
    lost = np.minimum(_lost(a.geo, ctx.alive, t, a_boxes, b.geo, b_box, ctx.rb), want)
    live = want - lost
    own_key = np.where(ctx.valid, own_box.key, -2)
    local = np.minimum(live, _domain_supply(ctx.dom, a_boxes, b_box, own_key))
    acc.need += need * scale
    acc.local += local * scale
    acc.fabric += (live - local) * scale
    acc.lost += lost * scale
    crossed = _cells(a_boxes, b_box) * ctx.stages
    own_cell = (held > 0).astype(float)  # the part of the new box the rank already holds needs no message
    acc.peers = np.maximum(acc.peers, np.where(live > 0, crossed - own_cell, 0))
    experts = b_box.experts if t.expert else 1.0
    copied = need > 0 if b.geo.separate else want > 0
    pieces = sum(x.pieces for x in ts) * len(kbs)
    acc.tensors += np.where(copied, pieces * ctx.slots_b * experts, 0.0)
    for k in kbs:
        acc.by_kind[k.name] = acc.by_kind.get(k.name, 0.0) + float(want.sum() * elems * k.bytes)
    moved = float(live.sum() * scale)
    if moved <= 0:
        return
    hold = np.where(ctx.alive, ctx.slots_a * a_boxes.area(), 0.0)
    share = moved * hold / hold.sum()
    frac_local = float(local.sum() / live.sum())
    np.add.at(acc.out_local, a.phys, share * frac_local)
    np.add.at(acc.out_fabric, a.phys, share * (1 - frac_local))
