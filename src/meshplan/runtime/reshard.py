"""Live layout switch inside one torchrun world: every persistent tensor (parameters, AdamW's moments and step)
moves from layout A's shards to layout B's by point-to-point messages, no storage involved.

``DTensor.redistribute`` refuses a different mesh and DCP reshards only through storage (shared/notes/elastic.md
sec. 3), so the switch is the chunk intersection DCP's load planner does (torch 2.13
``checkpoint/planner_helpers.py::_create_chunk_from_dtensor``) with the bytes sent by ``batch_isend_irecv``:

1. each rank lists the box (global offsets, sizes) of every tensor it holds under A and under B, from the
   tensors' placements (``compute_local_shape_and_global_offset``), and all ranks exchange the lists;
2. ``plan_moves`` (pure, rank-identical): for every box a rank holds under B, the distinct A boxes that meet
   it, each read from one of its holders (the rank itself when it holds it, else holders in turn);
3. ``execute``: rounds of at most ``budget`` bytes; per round one packed buffer per peer and one
   ``batch_isend_irecv``; the received regions are written into B's local shards;
4. B's parameters take the moved values, its optimizer a state dict built on B's placements.

A round is planned identically on every rank, so no rank waits on a message nobody sends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from meshplan.errors import PlanError

Box = tuple[tuple[int, ...], tuple[int, ...]]
"""(global offsets, sizes) of a local shard."""


@dataclass(frozen=True)
class Move:
    """One region of one tensor from a rank to a rank."""

    key: str
    src: int
    dst: int
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    @property
    def numel(self) -> int:
        """Elements of the region."""
        return math.prod(self.sizes)


def box_of(t: torch.Tensor) -> tuple[tuple[int, ...], Box]:
    """(global shape, box of this rank's shard) of a DTensor or a plain (whole) tensor."""
    if isinstance(t, DTensor):
        shape, offsets = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
        return tuple(t.shape), (tuple(offsets), tuple(shape))
    return tuple(t.shape), (tuple(0 for _ in t.shape), tuple(t.shape))


def _meet(a: Box, b: Box) -> Box | None:
    lo = tuple(max(x, y) for x, y in zip(a[0], b[0]))
    hi = tuple(min(x + s, y + t) for x, s, y, t in zip(a[0], a[1], b[0], b[1]))
    if any(h <= l for l, h in zip(lo, hi)):
        return None
    return lo, tuple(h - l for l, h in zip(lo, hi))


def plan_moves(held_a: list[dict[str, Box]], held_b: list[dict[str, Box]]) -> list[Move]:
    """Every region each rank must receive (self-copies included), in one order on every rank; raises PlanError
    when some part of B's state exists on no rank under A."""
    holders: dict[str, dict[Box, list[int]]] = {}
    for r, held in enumerate(held_a):
        for key, box in held.items():
            holders.setdefault(key, {}).setdefault(box, []).append(r)
    moves, missing = [], []
    for dst, held in enumerate(held_b):
        for key in sorted(held):
            want = held[key]
            got = 0
            for n, (box, ranks) in enumerate(sorted(holders.get(key, {}).items())):
                part = _meet(want, box)
                if part is None:
                    continue
                src = dst if dst in ranks else ranks[(dst + n) % len(ranks)]
                moves.append(Move(key=key, src=src, dst=dst, offsets=part[0], sizes=part[1]))
                got += math.prod(part[1])
            if got != math.prod(want[1]):
                missing.append(f"{key} on rank {dst}: {math.prod(want[1]) - got} of {math.prod(want[1])} elements")
    if missing:
        raise PlanError([f"layout A holds no copy of {m}" for m in missing[:3]])
    return moves


def rounds(moves: list[Move], *, itemsize: dict[str, int], budget: int) -> list[list[Move]]:
    """Split the moves into rounds of at most ``budget`` bytes each (a larger single move is a round alone)."""
    out, cur, size = [], [], 0
    for m in moves:
        b = m.numel * itemsize[m.key]
        if cur and size + b > budget:
            out.append(cur)
            cur, size = [], 0
        cur.append(m)
        size += b
    if cur:
        out.append(cur)
    return out


def _region(local: torch.Tensor, own: Box, m: Move) -> torch.Tensor:
    idx = tuple(slice(o - base, o - base + s) for o, base, s in zip(m.offsets, own[0], m.sizes))
    return local[idx] if idx else local


@dataclass(frozen=True)
class Side:
    """One layout's local tensors on this rank: key -> (local shard, its box)."""

    tensors: dict[str, tuple[torch.Tensor, Box]]


def execute(moves: list[Move], *, rank: int, src: Side, dst: Side, itemsize: dict[str, int], budget: int) -> int:
    """Run the moves; returns the bytes this rank received from others."""
    received = 0
    for rnd in rounds(moves, itemsize=itemsize, budget=budget):
        sends: dict[int, list[torch.Tensor]] = {}
        recvs: dict[int, list[Move]] = {}
        for m in rnd:
            if m.src == rank and m.dst == rank:
                t_src, own_src = src.tensors[m.key]
                t_dst, own_dst = dst.tensors[m.key]
                _region(t_dst, own_dst, m).copy_(_region(t_src, own_src, m))
            elif m.src == rank:
                t_src, own_src = src.tensors[m.key]
                sends.setdefault(m.dst, []).append(_region(t_src, own_src, m).reshape(-1))
            elif m.dst == rank:
                recvs.setdefault(m.src, []).append(m)
        ops, bufs = [], {}
        for peer in sorted(sends):
            ops.append(dist.P2POp(dist.isend, torch.cat(sends[peer]).contiguous(), peer))
        for peer in sorted(recvs):
            first = dst.tensors[recvs[peer][0].key][0]
            bufs[peer] = torch.empty(sum(m.numel for m in recvs[peer]), dtype=first.dtype, device=first.device)
            ops.append(dist.P2POp(dist.irecv, bufs[peer], peer))
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        for peer, ms in recvs.items():
            at = 0
            for m in ms:
                t_dst, own_dst = dst.tensors[m.key]
                _region(t_dst, own_dst, m).copy_(bufs[peer][at:at + m.numel].view(m.sizes))
                at += m.numel
            received += at * bufs[peer].element_size()
    return received
