"""Stack-dependent memory: Transformer Engine under fp8, bf16 gradient buffers of the performance recipes,
DeepSpeed ZeRO-3's buffers, and the planner's per-stack memory limit from the published runs."""

import csv

import pytest

from meshplan import catalog
from meshplan.calibrate.runs import load_runs
from meshplan.cost.estimate import estimate
from meshplan.cost.memory import act_bytes_per_token, bytes_per_param
from meshplan.cost.memory_limits import DEFAULT, RunPeak, limit_from, shipped, stack_limit
from meshplan.cost.memory_stack import deepspeed_zero3_bytes, fp8_saved_delta, fp8_workspace_bytes
from meshplan.search import SearchRequest
from meshplan.spec.plan import Plan

NEMO, MCORE, TITAN = (catalog.framework(n) for n in ("nemo", "megatron-core", "torchtitan"))


def test_fused_gqa_attention_keeps_grouped_keys_and_values():
    # Flash/cuDNN attention takes GQA keys and values unrepeated: q (a d), k and v (g d each), the output (a d),
    # the norm and QKV inputs (2 h each) and the fp32 log-sum-exp, per token, over tp (sequence parallel).
    layer = catalog.model("llama3.1-405b").decoder
    h, a, g, d, f, t = 16384, 128, 8, 128, 53248, 4
    plan = Plan(global_batch=1, seq_len=8192, tp=t, sp=True)
    attention = (4 * h + 2 * (a * d + 2 * g * d) + 2 * a * d + 4 * a) / t
    ffn = (4 * h + 2 * 2 * f + 2 * f) / t  # norm and FC1 inputs, SwiGLU's input (2f) and output (f)
    assert act_bytes_per_token(layer, plan, MCORE, recompute="none") == pytest.approx(attention + ffn)


def test_te_fp8_saves_linear_inputs_in_one_byte():
    # QKV and FC1 inputs (h/t each) and the FC2 input (f/t) drop a byte; the output projection's own fp8 copy of
    # the attention output adds a d / t.
    layer = catalog.model("llama3.1-405b").decoder
    h, a, d, f, t = 16384, 128, 128, 53248, 4
    plan = Plan(global_batch=1, seq_len=8192, tp=t, sp=True, precision="fp8")
    assert fp8_saved_delta(layer, plan, MCORE) == pytest.approx((-2 * h - f + a * d) / t)
    bf16 = act_bytes_per_token(layer, plan.with_(precision="bf16"), MCORE, recompute="none")
    assert act_bytes_per_token(layer, plan, MCORE, recompute="none") == pytest.approx(bf16 + (-2 * h - f + a * d) / t)
    # torchao's Float8Linear saves its 16-bit inputs; full recompute keeps only the (16-bit) layer input.
    assert fp8_saved_delta(layer, plan, TITAN) == 0.0
    assert act_bytes_per_token(layer, plan, MCORE, recompute="full") == pytest.approx(2 * h / t)


@pytest.mark.parametrize("stack,generation,weights,workspace", [
    (NEMO, "hopper", 1.0, 1.0),        # fp8 weights, plus their transposed cache on Hopper
    (NEMO, "blackwell", 1.0, 0.0),     # Blackwell GEMMs take either layout: no transpose
    (MCORE, "hopper", 2.0, 2.0),       # 16-bit weights beside an fp8 copy and its transpose
    (MCORE, "blackwell", 2.0, 1.0),
    (TITAN, "hopper", 2.0, 0.0),       # torchao casts at each use
])
def test_fp8_weight_bytes_by_stack_and_generation(stack, generation, weights, workspace):
    plan = Plan(global_batch=8, seq_len=4096, dp=8, zero=1, precision="fp8")
    assert bytes_per_param(plan, stack)[0] == weights
    assert fp8_workspace_bytes(plan, stack, generation) == workspace
    assert fp8_workspace_bytes(plan.with_(precision="bf16"), stack, generation) == 0.0


def test_performance_recipes_reduce_gradients_in_bf16():
    plan = Plan(global_batch=8, seq_len=4096, dp=8, zero=1)
    assert bytes_per_param(plan, NEMO)[1] == 2.0
    assert bytes_per_param(plan, catalog.framework("megatron-bridge"))[1] == 2.0
    assert bytes_per_param(plan, MCORE)[1] == 4.0  # Megatron-LM's own default: fp32 main_grad


def test_deepspeed_zero3_buffers_by_hand():
    # GPT 529.6B (h 20480, FFN 4h, tp 1): the largest module and weight is FC1, 4 h^2; gathered: it, the rest of
    # the layer up to the 1e9-element reuse distance, the 5e7 prefetch; its full fp16 gradient; two 5e8-element
    # ipg buffers. All 2 bytes.
    model = catalog.model("gpt-529.6b")
    h = model.hidden
    plan = Plan(global_batch=2560, seq_len=2048, dp=640, zero=3, micro_batch=4, precision="fp16")
    fc1 = 4 * h * h
    expect = 2 * (fc1 + 1e9 + 5e7) + 2 * fc1 + 2 * 2 * 5e8
    assert deepspeed_zero3_bytes(model, plan, unit=12 * h * h) == pytest.approx(expect)
    # DeepSpeed keeps the ZeRO paper's 2 + 2 + 12 bytes (16-bit partition, fp32 master and moments).
    assert bytes_per_param(plan, catalog.framework("deepspeed-2021")) == (2.0, 2.0, 12.0)


def test_memory_limit_rule():
    peaks = [RunPeak(id=f"r{i}", stack="s", fraction=x) for i, x in enumerate((0.5, 0.912, 0.7))]
    assert limit_from(peaks, "s").fraction == 0.92  # the largest, rounded up to a whole per cent
    assert limit_from(peaks[:2], "s").fraction == DEFAULT  # too few runs of its own
    low = [RunPeak(id=f"r{i}", stack="s", fraction=0.6) for i in range(5)]
    assert limit_from(low, "s").fraction == DEFAULT  # never below the 80 % rule
    over = low + [RunPeak(id="x", stack="s", fraction=1.3)]
    assert limit_from(over, "s").fraction == 1.0  # a run predicted over capacity is a model fault, not licence
    assert limit_from(low, "other").fraction == DEFAULT


@pytest.fixture(scope="module")
def visible(runs_csv):
    runs, _ = load_runs(runs_csv)
    return [(r, estimate(r.model, r.cluster, r.plan, stack=r.framework)) for r in runs]


def test_no_visible_run_is_predicted_out_of_memory_and_the_default_limit_admits_each(visible):
    for r, est in visible:
        frac = est.peak_memory / est.capacity
        assert frac <= 1.0, f"{r.id}: predicted {100 * frac:.1f} % of device memory, yet it ran"
        assert frac <= stack_limit(r.framework.name).fraction, r.id


def test_shipped_memory_limits_are_current(visible):
    # scripts/fit_memory_limits.py wrote the record from the current memory model.
    got = {p.id: p for p in shipped()}
    assert len(got) == len(visible)
    for r, est in visible:
        assert got[r.id].stack == r.framework.name
        assert got[r.id].fraction == pytest.approx(est.peak_memory / est.capacity, abs=1e-4), r.id


def test_search_request_takes_the_stack_limit_unless_pinned():
    req = SearchRequest(global_batch=8, seq_len=1024, framework=NEMO)
    lim = stack_limit("nemo")
    assert req.max_memory_fraction == lim.fraction and req.memory_limit_why == lim.why
    assert lim.fraction > DEFAULT  # NeMo's published recipes run closer to the device than 80 %
    pinned = SearchRequest(global_batch=8, seq_len=1024, framework=NEMO, max_memory_fraction=0.7)
    assert pinned.max_memory_fraction == 0.7 and pinned.memory_limit_why == "pinned"
    assert SearchRequest(global_batch=8, seq_len=1024, framework=catalog.framework("megatron-lm-2022")) \
        .max_memory_fraction == DEFAULT  # no published runs of its own


def test_shipped_file_has_one_row_per_run():
    from importlib import resources

    with resources.files("meshplan.calibrate").joinpath("memory_limits.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert len({r["id"] for r in rows}) == len(rows)


def test_plan_json_says_where_the_memory_limit_comes_from():
    import json

    from meshplan.report.search import result_json
    from meshplan.search import search

    res = search(catalog.model("tiny-llama"), catalog.cluster("8xh100-sxm"),
                 SearchRequest(global_batch=8, seq_len=256, framework=NEMO, top=1))
    doc = json.loads(json.dumps(result_json(res)))
    assert doc["memory_limit"] == {"fraction": stack_limit("nemo").fraction, "why": stack_limit("nemo").why}


def test_the_loss_kernel_sets_the_logits_bytes():
    # Megatron's vocab-parallel cross-entropy keeps 16-bit logits and its fp32 softmax (6 B a logit); torch's
    # F.cross_entropy on .float() logits holds the log-softmax, its gradient and the input gradient (12 B), and
    # loss_parallel under TP one more fp32 temporary (16 B). torchtitan's Dec-2024 code compiles the blocks, not the
    # loss: its compiled preset pays the eager loss.
    from meshplan.cost.memory import logits_bytes

    m = catalog.model("llama3.1-8b")
    plan = Plan(global_batch=4, seq_len=65536, cp=2, dp=4, zero=3)
    logits = 65536 / 2 * 128256
    assert logits_bytes(m, plan, MCORE) == pytest.approx(6 * logits)
    assert logits_bytes(m, plan, TITAN) == pytest.approx(12 * logits)
    assert logits_bytes(m, plan, catalog.framework("torchtitan-compiled")) == pytest.approx(12 * logits)
    assert logits_bytes(m, plan.with_(tp=2, cp=1, dp=4, sp=True), TITAN) == pytest.approx(16 * 65536 * 128256 / 2)
