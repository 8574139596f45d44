"""Bytes of a layout switch (``cost.transition``) and the rank map that keeps state in place
(``cost.rankmap``), on Llama-3-70B over 64 GPUs in scale-up domains of 8 under Megatron-Core, with values
checked by hand."""

from __future__ import annotations

import numpy as np
import pytest

from meshplan import catalog
from meshplan.cost.memory import model_params
from meshplan.cost.rankmap import choose_rank_map, default_phys, digit_rotations, kept_bytes, slot_orders
from meshplan.cost.state_layout import boxes, geometry, resident_bytes, slots_held, state_groups, state_tensors
from meshplan.cost.transition import Placement, transfer_bytes
from meshplan.spec.plan import Plan

MODEL = catalog.model("llama3-70b")
STACK = catalog.framework("megatron-core")
TENSORS = state_groups(MODEL)
N, DOMAIN = 64, 8
NONE = np.array([], dtype=np.int64)
NORMS = 80 * 4 * 8192
"""Elements replicated over tp in Llama-3-70B: two RMSNorms of 8192 (counted 2h each) per layer."""


def geo(**kw):
    return geometry(MODEL, Plan(global_batch=512, seq_len=4096, **kw), STACK)


A = geo(tp=8, dp=8, zero=1)
A_PHYS = np.arange(N)


def switch(b, b_phys=None, *, a=A, a_phys=A_PHYS, lost=NONE, tensors=TENSORS):
    b_phys = np.arange(b.n_ranks) if b_phys is None else np.asarray(b_phys, dtype=np.int64)
    return transfer_bytes(Placement(a, a_phys), Placement(b, b_phys), tensors=tensors, lost_gpus=lost,
                          domain=DOMAIN)


def inverse(a_phys, lost, universe):
    inv = np.full(universe, -1, dtype=np.int64)
    inv[a_phys] = np.arange(a_phys.shape[0])
    inv[lost] = -1
    return inv


def optimizer_need(b) -> np.ndarray:
    """Master + moments bytes each rank of ``b`` holds (from its boxes, independently of transfer_bytes)."""
    ranks = np.arange(b.n_ranks)
    out = np.zeros(b.n_ranks)
    for t in TENSORS:
        for k in b.kinds:
            if k.name in ("master", "moments"):
                out += slots_held(b, t, ranks) * boxes(b, t, k).area() * t.elems * k.bytes
    return out


def received(x) -> np.ndarray:
    return x.in_local + x.in_fabric


# 1. Identity -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kw", [dict(tp=8, dp=8, zero=1), dict(tp=8, pp=2, dp=4, zero=1),
                                dict(tp=8, dp=8, zero=3, dp_shard=4), dict(tp=8, dp=8)])
def test_identity_switch_moves_nothing(kw):
    a = geo(**kw)
    x = switch(a, a=a)
    assert x.moved == 0.0
    assert x.lost.sum() == 0.0
    assert x.peers.max() == 0
    assert x.tensors.max() == 0
    assert x.out_local.sum() == x.out_fabric.sum() == 0.0
    assert all(v == 0.0 for v in x.by_kind.values())
    np.testing.assert_allclose(x.need, resident_bytes(a, TENSORS), rtol=1e-12)
    np.testing.assert_allclose(x.resident_a, x.need, rtol=1e-12)


# 2. Splitting and merging sharded degrees -------------------------------------------------------------------


def split_phys() -> np.ndarray:
    """TP8 DP16: new rank t + 8 d' on old GPU t + 8 (d' / 2) for even d', on a new GPU 64 + ... for odd d'."""
    r = np.arange(128)
    t, d = r % 8, r // 8
    return np.where(d % 2 == 0, t + 8 * (d // 2), 64 + t + 8 * (d // 2))


def test_split_aligned_moves_nothing_to_old_gpus():
    b = geo(tp=8, dp=16, zero=1)
    phys = split_phys()
    x = switch(b, phys)
    old = phys < N
    assert received(x)[old].sum() == 0.0  # new shard d' = 2d is the first half of the old shard d
    assert x.tensors[old].sum() == 0.0
    np.testing.assert_allclose(received(x)[~old], x.need[~old], rtol=1e-12)  # the newcomers receive it all
    assert x.lost.sum() == 0.0
    np.testing.assert_allclose(x.need, resident_bytes(b, TENSORS), rtol=1e-12)
    # w16 is whole per tp shard on every replica: a newcomer needs 2 B of its tp shard; optimizer: 1/16 of it
    w16_need = x.need - optimizer_need(b)
    assert x.by_kind["w16"] == pytest.approx(w16_need[~old].sum(), rel=1e-12)
    assert x.by_kind["master"] + x.by_kind["moments"] == pytest.approx(optimizer_need(b)[~old].sum(), rel=1e-12)
    # The newcomers are whole domains (64.. ): nothing of the old state is on them, so all comes over the fabric.
    assert x.in_local.sum() == 0.0


@pytest.mark.parametrize("k", [2, 4])
def test_merge_k_shards_receives_k_minus_1_over_k(k):
    """TP8 DP8 -> TP8 DP(8/k) with new rank d' on old d = k d': the new ZeRO shard is k old ones, one held."""
    b = geo(tp=8, dp=8 // k, zero=1)
    r = np.arange(b.n_ranks)
    x = switch(b, r % 8 + 8 * k * (r // 8))
    np.testing.assert_allclose(received(x), (k - 1) / k * optimizer_need(b), rtol=1e-9)
    assert x.by_kind["w16"] == 0.0
    assert x.by_kind["master"] + x.by_kind["moments"] == pytest.approx(x.moved, rel=1e-12)
    assert x.by_kind["moments"] == pytest.approx(2 * x.by_kind["master"], rel=1e-12)  # 8 B vs 4 B
    assert x.in_local.sum() == 0.0  # the other k-1 shards live on other nodes (dp across domains)


def test_zero1_to_zero3_same_degrees_moves_nothing():
    """ZeRO-1 and ZeRO-3 shard master and moments alike; ZeRO-3 only drops the replicated 16-bit weights."""
    x = switch(geo(tp=8, dp=8, zero=3))
    assert x.moved == 0.0 and x.lost.sum() == 0.0
    assert x.total_need == pytest.approx(12 * (model_params(MODEL) + 7 * NORMS), rel=1e-12)  # one copy
    assert set(x.by_kind) == {"master", "moments"}


def test_zero3_to_zero1_gathers_seven_eighths_of_w16():
    """Back from ZeRO-3: each rank casts its 1/8 master slice and gathers the other 7/8 of its tp shard's w16
    from the 7 other replicas, all on other nodes."""
    a = geo(tp=8, dp=8, zero=3)
    x = switch(A, a=a)
    w16 = x.need - optimizer_need(A)
    np.testing.assert_allclose(x.in_fabric, 7 / 8 * w16, rtol=1e-9)
    assert x.in_local.sum() == 0.0
    assert x.by_kind["master"] == x.by_kind["moments"] == 0.0


def test_tp8_to_tp4_without_zero_is_all_local():
    """TP8 DP8 -> TP4 DP16, no ZeRO: a TP-4 shard is two TP-8 shards, both on every node. GPU 8n + j holds
    old shard j and plays new shard j mod 4 = {2(j mod 4), 2(j mod 4) + 1}: only j = 0 and j = 7 hold half
    of it. Everything else comes from the own domain."""
    a, b = geo(tp=8, dp=8), geo(tp=4, dp=16)
    x = switch(b, a=a)
    assert x.in_fabric.sum() == 0.0
    j = np.arange(N) % 8
    frac = received(x) / x.need
    replicated = 12 * 2 * NORMS  # kept on every rank (2 + 4 + 8 B per element); small beside the rest
    assert frac[(j == 0) | (j == 7)] == pytest.approx(0.5, abs=1e-3)
    assert frac[(j != 0) & (j != 7)] == pytest.approx(1.0, abs=1e-3)
    assert x.moved == pytest.approx(x.total_need * (1 - 2 / 8 / 2), rel=1e-3)
    assert replicated / x.need[0] < 1e-3


# 3. Node loss ----------------------------------------------------------------------------------------------


def test_node_loss_loses_one_eighth_of_the_optimizer_state():
    lost = np.arange(24, 32)
    b = geo(tp=8, dp=7, zero=1)
    phys = default_phys(np.arange(N), lost, b.n_ranks)
    assert np.intersect1d(phys, lost).size == 0
    x = switch(b, phys, lost=lost)
    # Physically the cluster keeps 12 B per element once, plus 7 more copies of the tp-replicated norms; the node
    # held ZeRO shard 3 of 8 of all of it.
    exact = 12 * (model_params(MODEL) + 7 * NORMS) / 8
    assert x.lost.sum() == pytest.approx(exact, rel=1e-6)
    assert x.lost.sum() == pytest.approx(12 * model_params(MODEL) / 8, rel=1e-3)
    # Only ZeRO shards d' = 2 (3/7 - 3/8 = 3/56 of the row range) and d' = 3 (1/2 - 3/7 = 4/56) meet shard 3/8.
    d = np.arange(b.n_ranks) // 8
    assert (x.lost[(d != 2) & (d != 3)] == 0).all()
    assert x.lost[d == 3].sum() / x.lost[d == 2].sum() == pytest.approx(4 / 3, rel=1e-9)
    # The replicated w16 survives on the other replicas.
    assert x.by_kind["w16"] == pytest.approx(0.0, abs=1e-3)
    # Lost GPUs send nothing.
    assert x.out_local[lost].sum() == x.out_fabric[lost].sum() == 0.0


# 4. Conservation -------------------------------------------------------------------------------------------

LOST_NODE = np.arange(24, 32)
TRANSITIONS = {
    "tp4dp16": (dict(tp=4, dp=16, zero=1), NONE, 64),
    "tp8pp2dp4": (dict(tp=8, pp=2, dp=4, zero=1), NONE, 64),
    "zero3": (dict(tp=8, dp=8, zero=3), NONE, 64),
    "zero3-tp4dp16": (dict(tp=4, dp=16, zero=3), NONE, 64),
    "hsdp": (dict(tp=8, dp=8, zero=3, dp_shard=4), NONE, 64),
    "node-loss-dp7": (dict(tp=8, dp=7, zero=1), LOST_NODE, 64),
    "node-loss-pp2dp3": (dict(tp=8, pp=2, dp=3, zero=1), np.arange(8, 16), 64),
    "grow-dp16": (dict(tp=8, dp=16, zero=1), NONE, 128),
}


@pytest.mark.parametrize("name", list(TRANSITIONS))
def test_conservation(name):
    kw, lost, usable = TRANSITIONS[name]
    b = geo(**kw)
    phys = default_phys(np.arange(usable), lost, b.n_ranks)
    x = switch(b, phys, lost=lost)
    sent = x.out_local.sum() + x.out_fabric.sum()
    assert sent == pytest.approx(x.moved, rel=1e-9, abs=1.0)
    assert (x.out_local >= 0).all() and (x.out_fabric >= 0).all()
    assert (received(x) + x.lost <= x.need * (1 + 1e-12)).all()
    # in + lost + what the rank's own old GPU already holds == need (kept_bytes computes the held part apart)
    inv = inverse(A_PHYS, lost, max(usable, N))
    held = kept_bytes(A, inv[phys], b, np.arange(b.n_ranks), TENSORS)
    np.testing.assert_allclose(received(x) + x.lost + held, x.need, rtol=1e-9)
    np.testing.assert_allclose(x.need, resident_bytes(b, TENSORS), rtol=1e-12)
    np.testing.assert_allclose(x.resident_a[A_PHYS], resident_bytes(A, TENSORS), rtol=1e-12)
    moved_or_lost = sum(x.by_kind.values())
    assert moved_or_lost == pytest.approx(x.moved + x.lost.sum(), rel=1e-9, abs=1.0)


def test_groups_and_tensors_give_the_same_bytes():
    b = geo(tp=4, pp=2, dp=8, zero=1)
    phys = default_phys(np.arange(72), np.arange(8), b.n_ranks)
    xg = switch(b, phys, lost=np.arange(8))
    xt = switch(b, phys, lost=np.arange(8), tensors=state_tensors(MODEL))
    for f in ("need", "in_local", "in_fabric", "lost", "out_local", "out_fabric", "resident_a", "peers"):
        np.testing.assert_allclose(getattr(xg, f), getattr(xt, f), rtol=1e-9, atol=1e-3, err_msg=f)


def test_peers_excludes_the_cell_a_rank_already_holds():
    x = switch(geo(tp=4, dp=16), a=geo(tp=8, dp=8))
    j = np.arange(N) % 8
    assert (x.peers[(j == 0) | (j == 7)] == 1).all()  # holds one of its two cells
    assert (x.peers[(j != 0) & (j != 7)] == 2).all()  # holds neither


def test_peers_by_hand():
    """ZeRO-3 -> ZeRO-1 over dp 8: each rank's w16 box crosses the 8 master slices of its tp shard."""
    x = switch(A, a=geo(tp=8, dp=8, zero=3))
    assert set(np.unique(x.peers)) <= {7, 8}
    x = switch(geo(tp=4, dp=16), a=geo(tp=8, dp=8))
    assert set(np.unique(x.peers)) <= {1, 2}


# 5. Rank map -----------------------------------------------------------------------------------------------

MAPS = {
    "tp8pp2dp4": (dict(tp=8, pp=2, dp=4, zero=1), NONE, 64, 1.4),
    "tp4dp16": (dict(tp=4, dp=16, zero=1), NONE, 64, 3.0),
    "tp8dp4": (dict(tp=8, dp=4, zero=1), NONE, 64, 1.0),
    "hsdp": (dict(tp=8, dp=8, zero=3, dp_shard=4), NONE, 64, 1.0),
    "grow-dp16": (dict(tp=8, dp=16, zero=1), NONE, 128, 1.0),
    "node-loss-dp7": (dict(tp=8, dp=7, zero=1), LOST_NODE, 64, 1.0),
    "node-loss-pp2dp3": (dict(tp=8, pp=2, dp=3, zero=1), np.arange(8, 16), 64, 1.0),
    "loss-grow-tp4pp2dp8": (dict(tp=4, pp=2, dp=8, zero=1), np.arange(8), 72, 3.0),
}


@pytest.mark.parametrize("name", list(MAPS))
def test_rank_map(name):
    kw, lost, usable, factor = MAPS[name]
    b = geo(**kw)
    ids = np.arange(usable)
    rm = choose_rank_map(A, A_PHYS, b, usable=ids, lost=lost, domain=DOMAIN, tensors=TENSORS)
    assert rm.kept >= rm.kept_default
    assert rm.kept >= factor * rm.kept_default
    assert rm.phys.shape == (b.n_ranks,)
    assert np.unique(rm.phys).shape[0] == b.n_ranks  # distinct
    assert np.isin(rm.phys, ids).all() and not np.isin(rm.phys, lost).any()
    assert sorted(rm.slot_order) == list(range(DOMAIN))
    inv = inverse(A_PHYS, lost, usable)
    assert kept_bytes(A, inv[rm.phys], b, np.arange(b.n_ranks), TENSORS).sum() == pytest.approx(rm.kept, rel=1e-9)
    base = default_phys(ids, lost, b.n_ranks)
    assert kept_bytes(A, inv[base], b, np.arange(b.n_ranks), TENSORS).sum() == pytest.approx(rm.kept_default,
                                                                                           rel=1e-9)
    x = switch(b, rm.phys, lost=lost)  # what stays is what the switch does not move
    assert x.total_need - x.moved - x.lost.sum() == pytest.approx(rm.kept, rel=1e-9)


def test_rank_map_finds_the_aligned_split_on_growth():
    """TP8 DP8 -> TP8 DP16 on 128 GPUs: the best map puts old replica d on new replica 2d (and the odd replicas
    on the 8 new domains), so old GPUs receive nothing, as in ``test_split_aligned_moves_nothing_to_old_gpus``."""
    b = geo(tp=8, dp=16, zero=1)
    rm = choose_rank_map(A, A_PHYS, b, usable=np.arange(128), lost=NONE, domain=DOMAIN, tensors=TENSORS)
    x = switch(b, rm.phys)
    assert received(x)[rm.phys < N].sum() == 0.0
    aligned = switch(b, split_phys())
    assert rm.kept == pytest.approx(aligned.total_need - aligned.moved, rel=1e-12)


def test_rank_map_slot_order_for_tp8_to_tp4():
    """TP8 -> TP4: the digit order (0 4 1 5 2 6 3 7) puts new tp rank k // 2 on GPU k, which holds half of it."""
    b = geo(tp=4, dp=16, zero=1)
    rm = choose_rank_map(A, A_PHYS, b, usable=np.arange(N), lost=NONE, domain=DOMAIN, tensors=TENSORS)
    assert rm.slot_order == (0, 4, 1, 5, 2, 6, 3, 7)
    np.testing.assert_array_equal(b.tp[np.argsort(rm.phys)], np.arange(N) % 8 // 2)


def test_rank_map_node_loss_70b_avoids_lost_gpus():
    b = geo(tp=8, dp=7, zero=1)
    rm = choose_rank_map(A, A_PHYS, b, usable=np.arange(N), lost=LOST_NODE, domain=DOMAIN, tensors=TENSORS)
    assert not np.isin(rm.phys, LOST_NODE).any()
    np.testing.assert_array_equal(np.sort(rm.phys), np.setdiff1d(np.arange(N), LOST_NODE))
    assert rm.kept >= rm.kept_default > 0


# 6. Slot orders and digit rotations ------------------------------------------------------------------------


def test_slot_orders():
    orders = slot_orders(8)
    assert len(orders) == 6 and len(set(orders)) == 6
    assert orders[0] == tuple(range(8))
    assert all(sorted(o) == list(range(8)) for o in orders)
    assert (0, 4, 1, 5, 2, 6, 3, 7) in orders and (0, 2, 4, 6, 1, 3, 5, 7) in orders
    assert slot_orders(4) == [(0, 1, 2, 3), (0, 2, 1, 3)]
    assert slot_orders(2) == [(0, 1)]
    assert slot_orders(1) == [(0,)]
    assert len(slot_orders(6)) == 2


def test_digit_rotations():
    rots = digit_rotations(8)
    assert len(rots) == 2
    for r in rots:
        assert sorted(r.tolist()) == list(range(8))
        assert r.tolist() != list(range(8))
    assert [0, 2, 4, 6, 1, 3, 5, 7] in [r.tolist() for r in rots]
    assert [0, 4, 1, 5, 2, 6, 3, 7] in [r.tolist() for r in rots]
    assert digit_rotations(2) == [] and digit_rotations(1) == []
