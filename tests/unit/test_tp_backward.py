"""The backward's TP collectives under stacks whose column-parallel layers run them beside their GEMMs (Megatron
LinearWithGradAccumulationAndAsyncCommunication, Transformer Engine layernorm_linear.py async_op=True)."""

import pytest

from meshplan import catalog
from meshplan.cost.comm import collective_time, plan_links
from meshplan.cost.ops import layer_ops
from meshplan.cost.stage import Ctx, tp_comm
from meshplan.spec.calibration import Calibration
from meshplan.spec.cluster import Pool
from meshplan.spec.plan import Plan

MODEL, GPU = catalog.model("llama3-70b"), catalog.gpu("h100-sxm")
CAL = Calibration()


def _backward(stack, *, precision: str = "bf16", sp: bool = True, bwd_gemm: float):
    plan = Plan(global_batch=1, seq_len=8192, tp=8, sp=sp, dp=1, precision=precision)
    ops = layer_ops(MODEL.decoder, tokens=8192, plan=plan, stack=stack)
    links = plan_links(plan, Pool(gpu=GPU, n_gpus=8))
    ctx = Ctx(model=MODEL, plan=plan, stack=stack, gpu=GPU, links=links, calib=CAL)
    return tp_comm(MODEL.decoder, ops, ctx, fwd_gemm=1.0, bwd_gemm=bwd_gemm)[1], links.tp


def _coll(kind: str, nbytes: float, link) -> float:
    return collective_time(kind, nbytes, size=8, link=link, calib=CAL)


def test_with_no_gemm_to_hide_behind_every_backward_collective_shows():
    # Two halves (attention, MLP), each: gather of the output gradient, re-gather of the saved input (fp8 under
    # Transformer Engine: 1 byte), reduce-scatter of the input gradient.
    msg = 8192 * MODEL.hidden * 2.0
    for precision, gathered in (("bf16", msg), ("fp8", msg / 2)):
        b, link = _backward(catalog.framework("megatron-core"), precision=precision, bwd_gemm=0.0)
        want = 2 * (_coll("all_gather", msg, link) + _coll("all_gather", gathered, link)
                    + _coll("reduce_scatter", msg, link))
        assert b == pytest.approx(want, rel=1e-12)


def test_behind_long_gemms_only_the_output_gradient_gather_waits():
    msg = 8192 * MODEL.hidden * 2.0
    b, link = _backward(catalog.framework("megatron-core"), bwd_gemm=10.0)
    assert b == pytest.approx(2 * _coll("all_gather", msg, link), rel=1e-12)
    # without SP the input gradient's all-reduce hides behind the weight-gradient GEMM
    assert _backward(catalog.framework("megatron-core"), sp=False, bwd_gemm=10.0)[0] == 0.0


def test_a_blocking_stack_pays_the_whole_all_reduce_each_way():
    msg = 8192 * MODEL.hidden * 2.0
    for sp in (True, False):
        b, link = _backward(catalog.framework("torchtitan"), sp=sp, bwd_gemm=10.0)
        assert b == pytest.approx(2 * _coll("all_reduce", msg, link), rel=1e-12)
