"""Which GPU plays which rank of the new layout: the assignment that keeps the most state where it already is (a
pure function of two layouts' geometries, so the planner and the switch-overhead fit use the same one).

The same pair of layouts can move almost nothing or almost all optimizer state depending on the rank map
(``shared/notes/elastic.md`` sec. 4.3); every system in use takes a fixed order (torchrun renumbers survivors in
order; ElasticMegatron ``get_global_rank``). The search here keeps the new layout's step time unchanged: it maps
whole scale-up domains onto whole domains (so every group keeps its span and its link) and permutes the slots
inside a domain the same way on every domain (so NIC rails stay aligned). Two choices:

1. the slot permutation: digit permutations of the domain's mixed radix (for 8 GPUs, the 6 orders of its three
   binary digits: ``t' = (r mod 8) div 2`` keeps half of a TP-8 shard on each TP-4 rank where ``r mod 4`` keeps
   none), scored on the diagonal of the domain map;
2. the domain map: a monotone alignment of the surviving domains (in old rank order) with the new layout's
   domains that maximises the bytes kept, by dynamic programming in a band around the proportional diagonal
   (sequence alignment with free gaps; a new domain left unmatched takes an added or idle one). It finds the
   stage-aligned map after a loss (each stage drops one domain instead of every later rank shifting) and the
   interleaved one after growth (old replica d plays new replica 2d).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from meshplan.cost.state_layout import Boxes, Geometry, StateTensor, boxes, common_table, overlap_area, split_limit


@dataclass(frozen=True, kw_only=True)
class RankMap:
    """The chosen assignment and what it keeps."""

    phys: np.ndarray
    """GPU id of each new logical rank."""
    slot_order: tuple[int, ...]
    """Position in its domain of each new local rank (identity = torchrun's order)."""
    kept: float
    """State bytes that stay on their GPU."""
    kept_default: float
    """Bytes the default order (survivors renumbered in order) keeps."""


def kept_bytes(a: Geometry, a_rank: np.ndarray, b: Geometry, b_rank: np.ndarray,
               tensors: tuple[StateTensor, ...]) -> np.ndarray:
    """Bytes of the new rank ``b_rank[i]``'s state that old rank ``a_rank[i]`` (-1: none) already holds.

    A box depends only on how the tensor splits (tp dim, experts, tp limit) and on the state kind's ZeRO stage,
    so tensors that split alike share one overlap per pair of stages (weighted by their slots and elements)."""
    ok = a_rank >= 0
    ar = np.maximum(a_rank, 0)
    out = np.zeros(b_rank.shape[0])
    pairs: dict[tuple, list] = {}
    for kb in b.kinds:
        ka = a.kind(kb.name) or a.kind("master")
        pairs.setdefault((ka.zero_stage, kb.zero_stage), [ka, kb, 0.0])[2] += kb.bytes
    splits: dict[tuple, list[StateTensor]] = {}
    for t in tensors:
        splits.setdefault((t.tp_dim, t.expert, split_limit(a, t), split_limit(b, t)), []).append(t)
    for alike in splits.values():
        t0 = alike[0]
        table = sum(common_table(a, b, t) * t.elems for t in alike)  # slots both hold x elements, per pp pair
        # State kinds whose shard status agrees share one box (``boxes``): one take and overlap per distinct pair.
        weight: dict[tuple, list] = {}
        for ka, kb, nbytes in pairs.values():
            ba, bb = boxes(a, t0, ka), boxes(b, t0, kb)
            weight.setdefault((id(ba), id(bb)), [ba, bb, 0.0])[2] += nbytes
        on_a: dict[int, Boxes] = {}
        on_b: dict[int, Boxes] = {}
        area = np.zeros(b_rank.shape[0])
        for ba, bb, nbytes in weight.values():
            xa = on_a.get(id(ba)) or on_a.setdefault(id(ba), ba.take(ar, keys=False))
            xb = on_b.get(id(bb)) or on_b.setdefault(id(bb), bb.take(b_rank, keys=False))
            area += overlap_area(xa, xb) * nbytes
        out += table[a.pp[ar], b.pp[b_rank]] * area
    return np.where(ok, out, 0.0)


def slot_orders(domain: int) -> list[tuple[int, ...]]:
    """Local permutations: every order of the digits of the domain's prime factorisation (identity first)."""
    primes, n, p = [], domain, 2
    while n > 1:
        while n % p == 0:
            primes.append(p)
            n //= p
        p += 1
    out = []
    for perm in itertools.permutations(range(len(primes))):
        order = []
        for k in range(domain):
            digits, rem = [], k
            for q in primes:
                digits.append(rem % q)
                rem //= q
            new, stride = 0, 1  # digit perm[i] of k becomes digit i of the new index
            for i in range(len(primes)):
                new += digits[perm[i]] * stride
                stride *= primes[perm[i]]
            order.append(new)
        if tuple(order) not in out:
            out.append(tuple(order))
    return out or [tuple(range(domain))]


@dataclass(frozen=True)
class _World:
    """Old state per GPU id and the domains of GPU ids."""

    inv: np.ndarray      # GPU id -> old logical rank (-1: none or lost)
    full: list           # domains whose every GPU is usable, ordered by their first old rank
    blank: list          # usable domains holding nothing
    domain: int


def _world(a_phys: np.ndarray, usable: np.ndarray, lost: np.ndarray, domain: int) -> _World:
    universe = int(max(a_phys.max(), usable.max())) + 1
    inv = np.full(universe, -1, dtype=np.int64)
    inv[a_phys] = np.arange(a_phys.shape[0])
    inv[lost] = -1
    ok = np.zeros(universe, dtype=bool)
    ok[usable] = True
    ok[lost] = False
    nd = universe // domain  # a partial last domain is never usable whole
    usable_d = ok[:nd * domain].reshape(nd, domain).all(axis=1)
    held = inv[:nd * domain].reshape(nd, domain)
    holds = (held >= 0).any(axis=1)
    full = np.flatnonzero(usable_d & holds)
    full = full[np.argsort(held[full].max(axis=1), kind="stable")].tolist()
    blank = np.flatnonzero(usable_d & ~holds).tolist()
    return _World(inv=inv, full=full, blank=blank, domain=domain)


def _scores(w: _World, a: Geometry, b: Geometry, tensors, order, pairs: np.ndarray) -> np.ndarray:
    """Kept bytes of new domain j on surviving domain full[i], for (i, j) rows of ``pairs``."""
    g = w.domain
    slots = np.arange(g)
    gpu = (np.asarray(w.full)[pairs[:, 0]][:, None] * g + slots[None, :]).ravel()
    new = (pairs[:, 1][:, None] * g + np.asarray(order)[None, :]).ravel()
    inside = new < b.n_ranks
    kept = kept_bytes(a, np.where(inside, w.inv[gpu], -1), b, np.minimum(new, b.n_ranks - 1), tensors)
    return np.where(inside, kept, 0.0).reshape(-1, g).sum(axis=1)


def _align(w: _World, a, b, tensors, order, n_new: int) -> list[int | None]:
    """Surviving domain index (into ``w.full``) for each new domain, or None (takes a blank/idle one).

    Sequence alignment with free gaps restricted to a band of columns around the diagonal: a cell (j, i) matches
    new domain j with old domain i and scores its kept bytes; its value is the score plus the best value of any
    cell up and to the left. ``best[c]`` holds that best over the rows done so far for columns <= c; columns
    right of the band only ever take the running maximum, so they are filled when the band reaches them."""
    n_old = len(w.full)
    if n_old == 0:
        return [None] * n_new
    band = 3 + int(np.ceil(n_old / n_new))
    centre = np.round(np.arange(n_new) * n_old / n_new).astype(np.int64)
    lo = np.clip(centre - band, 0, n_old - 1)
    hi = np.clip(centre + band, 0, n_old - 1)
    rows = [np.arange(lo[j], hi[j] + 1) for j in range(n_new)]
    pairs = np.stack([np.concatenate(rows), np.repeat(np.arange(n_new), [len(r) for r in rows])], axis=1)
    flat = _scores(w, a, b, tensors, order, pairs).tolist()
    best, best_cell = [0.0] * n_old, [-1] * n_old   # value, and the cell it ends at (-1: no match yet)
    top, top_cell, filled = 0.0, -1, -1            # the running maximum, for columns right of the band
    cells: list[tuple[int, int, int]] = []          # (new domain, old domain, previous cell)
    k = 0
    for j in range(n_new):
        a_lo, a_hi = int(lo[j]), int(hi[j])
        for c in range(filled + 1, a_hi + 1):
            best[c], best_cell[c] = top, top_cell
        filled = max(filled, a_hi)
        vals = []
        for i in range(a_lo, a_hi + 1):
            prev, prev_cell = (best[i - 1], best_cell[i - 1]) if i > 0 else (0.0, -1)
            vals.append((prev + flat[k], len(cells)))
            cells.append((j, i, prev_cell))
            k += 1
        run, run_cell = -1.0, -1
        for i, (v, cell) in zip(range(a_lo, a_hi + 1), vals):  # this row's cells raise the columns right of them
            if v > run:
                run, run_cell = v, cell
            if run > best[i]:
                best[i], best_cell[i] = run, run_cell
        if best[filled] > top:
            top, top_cell = best[filled], best_cell[filled]
    out: list[int | None] = [None] * n_new
    cell = top_cell
    while cell >= 0:
        j, i, cell = cells[cell]
        out[j] = i
    return out


def _place(w: _World, match: list, order, n_ranks: int) -> np.ndarray:
    """GPU ids of the new logical ranks from a domain match (unmatched ones take blank, then idle domains)."""
    g = w.domain
    used = {m for m in match if m is not None}
    spare = list(w.blank) + [w.full[i] for i in range(len(w.full)) if i not in used]
    phys = np.full(n_ranks, -1, dtype=np.int64)
    for j, m in enumerate(match):
        dom = w.full[m] if m is not None else spare.pop(0)
        for k in range(g):
            r = j * g + order[k]
            if r < n_ranks:
                phys[r] = dom * g + k
    return phys


def digit_rotations(n: int) -> list[np.ndarray]:
    """Domain orders that rotate the digits of the domain index's prime factorisation (for 8 domains,
    j = (d0 d1 p) -> (p d0 d1): old replica 2d'+p plays new replica d' of stage p, which no monotone map can)."""
    primes, m, p = [], n, 2
    while m > 1 and p <= m:
        while m % p == 0:
            primes.append(p)
            m //= p
        p += 1
    j = np.arange(n)
    digits, rem = [], j.copy()
    for q in primes:
        digits.append(rem % q)
        rem //= q
    out = []
    for r in range(1, len(primes)):
        perm = primes[r:] + primes[:r]
        dig = digits[r:] + digits[:r]
        idx, stride = np.zeros(n, dtype=np.int64), 1
        for q, d in zip(perm, dig):
            idx, stride = idx + d * stride, stride * q
        out.append(idx)
    return out


def default_phys(usable: np.ndarray, lost: np.ndarray, n_ranks: int) -> np.ndarray:
    """torchrun's order: the usable GPUs that are not lost, renumbered in id order."""
    ids = np.setdiff1d(usable, lost)
    return ids[:n_ranks]


def choose_rank_map(a: Geometry, a_phys: np.ndarray, b: Geometry, *, usable: np.ndarray, lost: np.ndarray,
                    domain: int, tensors: tuple[StateTensor, ...]) -> RankMap:
    """The assignment of the new layout's ranks to ``usable`` GPU ids that keeps the most state in place."""
    w = _world(a_phys, usable, lost, domain)
    base = default_phys(usable, lost, b.n_ranks)
    kept_default = float(kept_bytes(a, w.inv[base], b, np.arange(b.n_ranks), tensors).sum())
    n_new = -(-b.n_ranks // domain)
    if n_new > len(w.full) + len(w.blank):
        return RankMap(phys=base, slot_order=tuple(range(domain)), kept=kept_default, kept_default=kept_default)
    n_old = max(len(w.full), 1)
    diag = np.stack([np.minimum(np.round(np.arange(n_new) * n_old / n_new), len(w.full) - 1),
                     np.arange(n_new)], axis=1).astype(np.int64)
    orders = slot_orders(domain)
    order = orders[0] if not w.full else max(orders, key=lambda o: _scores(w, a, b, tensors, o, diag).sum())
    matches = [_align(w, a, b, tensors, order, n_new)]
    if len(w.full) == n_new:
        matches += [list(rot) for rot in digit_rotations(n_new)]
    best = None
    for match in matches:
        phys = _place(w, match, order, b.n_ranks)
        kept = float(kept_bytes(a, w.inv[phys], b, np.arange(b.n_ranks), tensors).sum())
        if best is None or kept > best[0]:
            best = (kept, phys)
    kept, phys = best
    if kept <= kept_default:
        return RankMap(phys=base, slot_order=tuple(range(domain)), kept=kept_default, kept_default=kept_default)
    return RankMap(phys=phys, slot_order=tuple(order), kept=kept, kept_default=kept_default)
