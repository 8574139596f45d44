"""Persistent state as boxes over (layer slots, experts, rows, cols): tensor sizes against the memory model,
per-rank bytes against ``sharded_state``, and the boxes of every layout tiling each tensor exactly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from meshplan import catalog
from meshplan.cost.estimate import stage_layers
from meshplan.cost.memory import bytes_per_param, layer_params, model_params, sharded_state
from meshplan.cost.stage import stage_params
from meshplan.cost.state_layout import (
    NEVER,
    boxes,
    geometry,
    overlap_area,
    resident_bytes,
    slots_held,
    state_groups,
    state_kinds,
    state_tensors,
)
from meshplan.errors import SpecError
from meshplan.spec.checks import plan_violations
from meshplan.spec.io import parse_gpus
from meshplan.spec.plan import Plan
from meshplan.spec.schedules import rank_stages

STACK = catalog.framework("megatron-core")
MODELS = ["llama3-70b", "mixtral-8x7b", "deepseek-v3", "tiny-llama", "tiny-moe", "tiny-gpt", "llava-1.5-7b",
          "llama3.2-1b"]
"""Dense GQA, MoE, MLA with shared experts, the tiny test models, biases, a projector without attention whose
input width differs (in_proj), tied embeddings."""


def plan(**kw) -> Plan:
    return Plan(global_batch=512, seq_len=4096, **kw)


def memory_model_bytes(model, p: Plan, stack=STACK) -> np.ndarray:
    """Weights + optimizer bytes of each pipeline rank by ``cost.memory.sharded_state`` over its stages."""
    layers = stage_layers(model, p)
    out = []
    for stages in rank_stages(p.schedule_name, pp=p.pp, n_stages=p.n_stages):
        dense = expert = 0.0
        for s in stages:
            d, e = stage_params(model, layers[s], p, first=s == 0, last=s == p.n_stages - 1)
            dense, expert = dense + d, expert + e
        w, _, o = sharded_state(p, stack, dense=dense, expert=expert)
        out.append(w + o)
    return np.array(out)


# 1. Tensor sizes -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_layer_tensors_sum_to_layer_params(name):
    model = catalog.model(name)
    tensors = state_tensors(model)
    slot = 1
    for block in model.blocks:
        mine = [t for t in tensors if t.slot_lo == slot]
        assert mine, block.name
        assert all(t.slot_hi == slot + block.n_layers for t in mine)
        assert all(t.name.startswith(f"{block.name}.") for t in mine)
        dense, expert = layer_params(block.layer)
        assert sum(t.elems for t in mine if not t.expert) == pytest.approx(dense, rel=1e-12)
        assert sum(t.elems for t in mine if t.expert) == pytest.approx(expert, rel=1e-12, abs=1e-9)
        slot += block.n_layers
    assert slot == model.n_layers + 1


@pytest.mark.parametrize("name", MODELS)
def test_embedding_and_head(name):
    model = catalog.model(name)
    tensors = state_tensors(model)
    emb = [t for t in tensors if t.name == "embedding"]
    head = [t for t in tensors if t.name == "head"]
    assert len(emb) == 1 and emb[0].elems == model.vocab * model.hidden
    assert (emb[0].slot_lo, emb[0].slot_hi, emb[0].tp_dim, emb[0].expert) == (0, 1, 0, False)
    if model.tied_embeddings:
        assert head == []
    else:
        assert len(head) == 1 and head[0].elems == model.vocab * model.hidden
        assert (head[0].slot_lo, head[0].slot_hi) == (model.n_layers + 1, model.n_layers + 2)
    total = sum(t.elems * (t.slot_hi - t.slot_lo) for t in tensors)
    assert total == pytest.approx(model_params(model), rel=1e-12)


def test_every_catalog_model_sums_to_model_params():
    for model_name in catalog.model_names():
        model = catalog.model(model_name)
        total = sum(t.elems * (t.slot_hi - t.slot_lo) for t in state_tensors(model))
        assert total == pytest.approx(model_params(model), rel=1e-12), model_name


def test_mixtral_tensor_roles_by_hand():
    """Mixtral-8x7B layer: q 4096x4096, k+v 2x4096x1024, o 4096x4096, router 4096x8, 8 experts of w1,w3
    (4096x14336 each) and w2 (14336x4096), two RMSNorms (counted 2h each, as ``layer_params``)."""
    model = catalog.model("mixtral-8x7b")
    by_role = {t.name.split(".")[-1]: t for t in state_tensors(model) if t.slot_lo == 1}
    h, f = 4096, 14336
    assert by_role["q"].elems == h * h and by_role["q"].tp_dim == 0
    assert by_role["kv"].elems == 2 * h * 1024 and by_role["kv"].tp_dim == 0
    assert by_role["proj"].elems == h * h and by_role["proj"].tp_dim == 1
    assert by_role["router"].elems == h * 8 and by_role["router"].tp_dim is None
    assert by_role["experts_up"].elems == 8 * 2 * h * f and by_role["experts_up"].expert
    assert by_role["experts_down"].elems == 8 * h * f and by_role["experts_down"].tp_dim == 1
    assert not any(t.expert for r, t in by_role.items() if not r.startswith("experts"))
    assert by_role["norm1"].elems == by_role["norm2"].elems == 2 * h


# 2. Groups -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_state_groups_preserve_elements_per_slot_range(name):
    model = catalog.model(name)
    tensors, groups = state_tensors(model), state_groups(model)
    assert len(groups) <= len(tensors)

    def per(ts, key):
        out: dict = {}
        for t in ts:
            out[key(t)] = out.get(key(t), 0.0) + t.elems
        return out

    for key in (lambda t: (t.slot_lo, t.slot_hi), lambda t: (t.slot_lo, t.slot_hi, t.tp_dim, t.expert)):
        a, b = per(tensors, key), per(groups, key)
        assert a.keys() == b.keys()
        for k in a:
            assert b[k] == pytest.approx(a[k], rel=1e-12)
    assert sum(g.pieces for g in groups) == pytest.approx(sum(t.pieces for t in tensors))
    shapes = [(g.slot_lo, g.slot_hi, g.tp_dim, g.expert, g.tp_max) for g in groups]
    assert len(set(shapes)) == len(shapes)  # nothing left to merge


# 3. Resident bytes against the memory model ------------------------------------------------------------------

LAYOUTS = [
    ("llama3-70b", dict(tp=8, dp=8, zero=1)),
    ("llama3-8b", dict(dp=16, zero=1)),
    ("llama3-8b", dict(tp=2, dp=4)),
    ("llama3-70b", dict(tp=8, pp=4, dp=2, zero=1)),
    ("llama3-70b", dict(tp=4, dp=16, zero=3, dp_shard=8)),
    ("llama3-70b", dict(tp=8, dp=8, zero=3, dp_shard=4)),
    ("mixtral-8x7b", dict(tp=2, pp=2, dp=8, ep=8, zero=1)),
    ("llama3-70b", dict(tp=8, pp=4, vpp=5, dp=2, zero=1)),
    ("deepseek-v3", dict(pp=16, dp=64, ep=64, zero=1)),
]


@pytest.mark.parametrize("name,kw", LAYOUTS, ids=[f"{n}-{'-'.join(f'{k}{v}' for k, v in kw.items())}"
                                                  for n, kw in LAYOUTS])
def test_resident_bytes_match_memory_model(name, kw):
    model, p = catalog.model(name), plan(**kw)
    g = geometry(model, p, STACK)
    got = resident_bytes(g, state_tensors(model))
    ref = memory_model_bytes(model, p)
    # Norms (and MLA down-projections, the router) stay whole on every tp rank; the memory model divides
    # every dense parameter by tp: 0.026 % for Llama-3-70B at tp 8.
    np.testing.assert_allclose(got, ref[g.pp], rtol=1e-3)
    # Every rank of one pipeline coordinate holds the same bytes.
    for s in range(p.pp):
        mine = got[g.pp == s]
        np.testing.assert_allclose(mine, mine[0], rtol=1e-12)
    # The merged groups give the same bytes.
    np.testing.assert_allclose(resident_bytes(g, state_groups(model)), got, rtol=1e-12)


def test_resident_bytes_by_hand_dp_zero1():
    """Llama-3-70B, TP8 DP8 ZeRO-1: every rank keeps 2 B of its tp shard and 12 B of a 1/64 shard (norms: whole
    over tp, 1/8 of them over dp), so the cluster holds 2 B x 8 copies + 12 B x 1 copy of each parameter
    (norms: x 8 more over tp)."""
    model, p = catalog.model("llama3-70b"), plan(tp=8, dp=8, zero=1)
    got = resident_bytes(geometry(model, p, STACK), state_tensors(model))
    norms = 80 * 4 * 8192
    params = model_params(model)
    assert got.sum() == pytest.approx(2 * 8 * (params + 7 * norms) + 12 * (params + 7 * norms), rel=1e-12)


# 4. Boxes tile each tensor -----------------------------------------------------------------------------------

ORDERS = ["tp-cp-ep-dp-pp", "dp-tp-cp-ep-pp", "tp-cp-ep-pp-dp", "pp-dp-cp-tp-ep"]


def check_tiling(model, p: Plan) -> None:
    g = geometry(model, p, STACK)
    n = p.n_gpus
    ranks = np.arange(n)
    ii, jj = (x.ravel() for x in np.meshgrid(ranks, ranks, indexing="ij"))
    for t in state_tensors(model):
        held = slots_held(g, t, ranks)
        for kind in g.kinds:
            bx = boxes(g, t, kind)
            keys, counts = np.unique(bx.key, return_counts=True)
            assert (counts == counts[0]).all(), (t.name, kind.name)
            replicas = n / keys.shape[0]
            assert float((bx.area() * held).sum()) == pytest.approx((t.slot_hi - t.slot_lo) * replicas,
                                                                  rel=1e-12), (t.name, kind.name)
            ov = overlap_area(bx.take(ii), bx.take(jj))
            same = bx.key[ii] == bx.key[jj]
            # equal keys: identical boxes (their overlap is the whole of both), on one pipeline coordinate
            np.testing.assert_allclose(ov[same], bx.area()[ii][same], rtol=1e-12)
            np.testing.assert_allclose(bx.area()[ii][same], bx.area()[jj][same], rtol=1e-12)
            assert (g.pp[ii][same] == g.pp[jj][same]).all()
            # distinct keys on the same pipeline coordinate: disjoint
            apart = ~same & (g.pp[ii] == g.pp[jj])
            assert np.all(ov[apart] <= 1e-15), (t.name, kind.name)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(name=st.sampled_from(["tiny-llama", "tiny-moe"]), tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2]),
       dp=st.sampled_from([1, 2, 4]), cp=st.sampled_from([1, 1, 2]), zero=st.sampled_from([0, 1, 3]),
       dp_shard=st.sampled_from([0, 0, 2]), vpp=st.sampled_from([1, 2]), ep=st.sampled_from([1, 2, 4]),
       etp=st.sampled_from([1, 1, 2]), order=st.sampled_from(ORDERS))
def test_boxes_tile_every_tensor(name, tp, pp, dp, cp, zero, dp_shard, vpp, ep, etp, order):
    model = catalog.model(name)
    if not model.is_moe:
        ep = etp = 1
    try:
        p = Plan(global_batch=16, seq_len=64, tp=tp, pp=pp, dp=dp, cp=cp, zero=zero, dp_shard=dp_shard, vpp=vpp,
                 ep=ep, etp=etp, rank_order=order)
    except SpecError:
        assume(False)
    assume(not plan_violations(model, parse_gpus(f"{p.n_gpus}xh100-sxm", catalog.gpu), p))
    check_tiling(model, p)


@pytest.mark.parametrize("name,kw", [
    ("tiny-llama", dict(tp=4, dp=2, zero=1)),  # tp > n_kv_heads: each kv head on 2 tp ranks
    ("tiny-moe", dict(tp=2, dp=4, ep=4, zero=3, dp_shard=2)),
    ("tiny-moe", dict(tp=2, pp=2, dp=2, ep=2, etp=2, zero=1, rank_order="dp-tp-cp-ep-pp")),
    ("tiny-llama", dict(tp=2, cp=2, pp=2, vpp=2, dp=2, zero=1, rank_order="tp-cp-ep-pp-dp")),
])
def test_boxes_tile_fixed_layouts(name, kw):
    check_tiling(catalog.model(name), Plan(global_batch=16, seq_len=64, **kw))


def test_boxes_by_hand_tp8_dp8_zero1():
    """Llama-3-70B TP8 DP8 ZeRO-1 (tp fastest): rank r = t + 8 d. Column-parallel q: w16 is the tp row shard
    (1/8), master a 1/8 slice of it (1/64); row-parallel proj: tp splits cols, ZeRO the rows of that shard."""
    model, p = catalog.model("llama3-70b"), plan(tp=8, dp=8, zero=1)
    g = geometry(model, p, STACK)
    np.testing.assert_array_equal(g.tp, np.arange(64) % 8)
    np.testing.assert_array_equal(g.zero, np.arange(64) // 8)
    by_role = {t.name.split(".")[-1]: t for t in state_tensors(model)}
    w16, master, moments = g.kinds
    for role in ("q", "proj"):
        t = by_role[role]
        bw, bm, bo = boxes(g, t, w16), boxes(g, t, master), boxes(g, t, moments)
        np.testing.assert_allclose(bw.area(), 1 / 8)
        np.testing.assert_allclose(bm.area(), 1 / 64)
        np.testing.assert_array_equal(bw.key, np.arange(64) % 8)
        np.testing.assert_array_equal(bm.key, bo.key)
        assert np.unique(bm.key).shape[0] == 64
        r = np.arange(64)
        np.testing.assert_allclose(overlap_area(bm, bw), 1 / 64)  # the master shard lies in the rank's w16
        np.testing.assert_allclose(overlap_area(bm.take(r), bw.take((r + 1) % 8 + 8 * (r // 8))), 0.0)
        np.testing.assert_allclose(overlap_area(bm.take(r), bm.take((r + 8) % 64)), 0.0)
    norm = by_role["norm1"]
    np.testing.assert_allclose(boxes(g, norm, w16).area(), 1.0)  # replicated over tp and dp
    np.testing.assert_allclose(boxes(g, norm, master).area(), 1 / 8)  # ZeRO over dp only


def test_expert_boxes_by_hand():
    """Mixtral TP2 DP8 EP8 ZeRO-1: each rank holds 1/8 of the experts; ep*etp = 8 of tp*dp = 16 ranks, so the
    expert-data-parallel group is 2 and each rank keeps half its experts' optimizer state."""
    model, p = catalog.model("mixtral-8x7b"), plan(tp=2, dp=8, ep=8, zero=1)
    assert p.expert_zero_group == 2
    g = geometry(model, p, STACK)
    t = next(t for t in state_tensors(model) if t.name.endswith("experts_up"))
    w16, master, _ = g.kinds
    np.testing.assert_allclose(boxes(g, t, w16).area(), 1 / 8)
    np.testing.assert_allclose(boxes(g, t, master).area(), 1 / 16)
    assert sorted(np.bincount(g.ep).tolist()) == [2] * 8


# 5. State kinds --------------------------------------------------------------------------------------------


def kinds_of(**kw):
    stack = kw.pop("stack", STACK)
    p = plan(**kw)
    return p, stack, [(k.name, k.bytes, k.zero_stage) for k in state_kinds(p, stack)]


@pytest.mark.parametrize("zero", [0, 1, 2])
def test_state_kinds_bf16_distributed_optimizer(zero):
    p, stack, kinds = kinds_of(tp=8, dp=8, zero=zero)
    assert kinds == [("w16", 2.0, NEVER), ("master", 4.0, 1), ("moments", 8.0, 1)]
    w, _, o = bytes_per_param(p, stack)
    assert sum(b for _, b, _ in kinds) == w + o == 14.0


def test_state_kinds_zero3_and_fp32():
    for kw in (dict(dp=8, zero=3), dict(dp=8, zero=1, precision="fp32")):
        p, stack, kinds = kinds_of(**kw)
        assert kinds == [("master", 4.0, 3), ("moments", 8.0, 1)]
        w, _, o = bytes_per_param(p, stack)
        assert sum(b for _, b, _ in kinds) == w + o == 12.0


def test_state_kinds_fp16_and_bf16_moments():
    _, _, kinds = kinds_of(dp=8, zero=1, precision="fp16")
    assert kinds == [("w16", 2.0, NEVER), ("master", 4.0, 1), ("moments", 8.0, 1)]
    stack = STACK.with_(optimizer_dtype="bf16")
    p, stack, kinds = kinds_of(dp=8, zero=1, stack=stack)
    assert kinds == [("w16", 2.0, NEVER), ("master", 4.0, 1), ("moments", 4.0, 1)]
    w, _, o = bytes_per_param(p, stack)
    assert sum(b for _, b, _ in kinds) == w + o == 10.0


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_which_kinds_are_sharded(zero):
    """w16 is never sharded; master from stage 1 (stage 3 when it is the only weight copy); moments from 1."""
    model = catalog.model("llama3-8b")
    p = plan(tp=2, dp=4, zero=zero)
    g = geometry(model, p, STACK)
    t = next(t for t in state_tensors(model) if t.name.endswith(".q"))
    for kind in g.kinds:
        area = boxes(g, t, kind).area()
        sharded = zero >= kind.zero_stage
        np.testing.assert_allclose(area, 1 / 2 / (4 if sharded else 1))
        if kind.name == "w16":
            assert not sharded
