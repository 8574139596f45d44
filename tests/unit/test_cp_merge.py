"""Ring context parallelism's per-step merges outside the attention kernel, against hand computations."""

import dataclasses

import pytest

from meshplan import catalog
from meshplan.cost.comm import plan_links
from meshplan.cost.ops import layer_ops
from meshplan.cost.stage import Ctx, cp_step_merge
from meshplan.errors import SpecError
from meshplan.spec.calibration import Calibration
from meshplan.spec.cluster import Pool
from meshplan.spec.plan import Plan

GPU = catalog.gpu("h100-sxm")
MODEL = catalog.model("llama3-8b")  # 32 query heads, 8 kv heads, head_dim 128


def _merge(stack, *, cp: int, tp: int = 1, seq: int = 65536, kind: str = "ring"):
    plan = Plan(global_batch=1, seq_len=seq, tp=tp, sp=tp > 1, cp=cp, cp_kind=kind, dp=1)
    ops = layer_ops(MODEL.decoder, tokens=seq // cp, plan=plan, stack=stack)
    cal = Calibration()
    ctx = Ctx(model=MODEL, plan=plan, stack=stack, gpu=GPU, links=plan_links(plan, Pool(gpu=GPU, n_gpus=8)), calib=cal)
    return cp_step_merge(MODEL.decoder, ops, ctx), GPU.hbm_bandwidth * cal.mem_eff


def test_torch_ring_merges_repeated_kv_in_fp32_each_step():
    # torchtitan repeats K/V to the 32 query heads: per rank 16384 tokens x 32 x 128 output elements and twice that
    # of K and V; each of the 4 steps moves 32.5 B per output element and 4 per K/V element forward, 11.5 and 23.5
    # backward (torch _templated_ring_attention, FrameworkProfile.cp_step_bytes).
    (fwd, bwd), bw = _merge(catalog.framework("torchtitan"), cp=4)
    out = 16384 * 32 * 128
    assert fwd == pytest.approx(4 * (32.5 * out + 4.0 * 2 * out) / bw, rel=1e-12)
    assert bwd == pytest.approx(4 * (11.5 * out + 23.5 * 2 * out) / bw, rel=1e-12)


def test_te_ring_keeps_grouped_kv_and_splits_heads_over_tp():
    # Transformer Engine rotates the 8 kv heads un-repeated; tp=2 halves every head count on the rank.
    (fwd, bwd), bw = _merge(catalog.framework("megatron-core"), cp=2, tp=2)
    out, kv = 32768 * 16 * 128, 32768 * 4 * 256
    assert fwd == pytest.approx(2 * (5.5 * out + 1.0 * kv) / bw, rel=1e-12)
    assert bwd == pytest.approx(2 * (7.5 * out + 5.5 * kv) / bw, rel=1e-12)


def test_no_merge_without_a_ring():
    tt = catalog.framework("torchtitan")
    assert _merge(tt, cp=1)[0] == (0.0, 0.0)
    assert _merge(catalog.framework("megatron-deepspeed"), cp=4)[0] == (0.0, 0.0)  # no per-step bytes: Ulysses
    # at a fixed share of the sequence per rank the merge grows with the ring's length
    assert _merge(tt, cp=8, seq=8 * 8192)[0][0] == pytest.approx(2 * _merge(tt, cp=4, seq=4 * 8192)[0][0], rel=1e-12)


def test_step_bytes_are_validated():
    tt = catalog.framework("torchtitan")
    with pytest.raises(SpecError, match="cp_step_bytes"):
        tt.with_(cp_step_bytes=(1.0, 2.0))
    with pytest.raises(SpecError, match="cp_step_bytes"):
        tt.with_(cp_step_bytes=(1.0, 2.0, 3.0, -1.0))
    assert dataclasses.replace(tt, cp_step_bytes=(0.0, 0.0, 0.0, 0.0)).cp_step_bytes == (0.0, 0.0, 0.0, 0.0)
