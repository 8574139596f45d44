"""Cost formulas against hand computations from their papers."""

import dataclasses

import pytest

from meshplan import catalog
from meshplan.cost.comm import collective_time
from meshplan.cost.estimate import estimate
from meshplan.cost.flops import model_flops
from meshplan.cost.memory import (
    RankLoad,
    act_bytes_per_token,
    bytes_per_param,
    embedding_grad_bytes,
    layer_params,
    logits_bytes,
    model_params,
    moe_eager_extra_bytes,
    pipelined_grads,
    rank_memory,
)
from meshplan.cost.stage import mtp_depth
from meshplan.spec.calibration import Calibration
from meshplan.spec.cluster import GroupLink, Pool, group_link
from meshplan.spec.plan import Plan

MEGATRON = catalog.framework("megatron-core")
EAGER = catalog.framework("meshplan")  # eager PyTorch modules, DTensor TP, FSDP2: the runtime's own stack


def non_causal(model):
    blocks = tuple(dataclasses.replace(b, layer=dataclasses.replace(
        b.layer, attention=dataclasses.replace(b.layer.attention, causal=False))) for b in model.blocks)
    return dataclasses.replace(model, blocks=blocks)


def test_model_flops_match_narayanan_eq3_without_recompute():
    # Narayanan et al. 2021 eq. 3 without the recompute forward: 72 B s l h^2 (1 + s/(6h) + V/(12 l h)).
    m = non_causal(catalog.model("gpt3-175b"))
    B, s, l, h, V = 1536, 2048, 96, 12288, 51200
    expected = 72 * B * s * l * h**2 * (1 + s / (6 * h) + V / (12 * l * h))
    got = model_flops(m, Plan(global_batch=B, seq_len=s))
    assert got == pytest.approx(expected, rel=1e-12)


def test_causal_attention_halves_the_score_flops():
    m = catalog.model("gpt3-175b")
    full = model_flops(non_causal(m), Plan(global_batch=1, seq_len=2048))
    causal = model_flops(m, Plan(global_batch=1, seq_len=2048))
    # The s^2 term is 12 s^2 l h per sequence; causal masking removes half of it.
    assert full - causal == pytest.approx(0.5 * 12 * 2048**2 * 96 * 12288, rel=1e-12)


def test_gpt3_parameter_count():
    # 12 l h^2 (plus biases/norms) + V h (tied) = 174.6B for GPT-3 175B (Narayanan Table 1 names it 174.6B).
    p = model_params(catalog.model("gpt3-175b"))
    assert p == pytest.approx(174.6e9, rel=0.002)


def test_llama3_8b_parameter_count():
    assert model_params(catalog.model("llama3-8b")) == pytest.approx(8.03e9, rel=0.005)


def test_qwen3_32b_parameter_count():
    # Qwen3-32B model card: 32.8B parameters (64 heads of 128 project 5120 -> 8192, untied head).
    assert model_params(catalog.model("qwen3-32b")) == pytest.approx(32.8e9, rel=0.005)


def test_zero_paper_bytes_per_parameter():
    # Rajbhandari et al. 2020 sec. 3.1: fp16 weights 2 + fp16 grads 2 + fp32 master/momentum/variance 12.
    assert bytes_per_param(Plan(global_batch=1, seq_len=1, precision="fp16"), MEGATRON) == (2.0, 2.0, 12.0)


def test_precision_aware_optimizer_bytes_per_parameter():
    # Megatron bf16: fp32 main grads (4) and fp32 master + moments (12); its precision-aware optimizer with bf16
    # main grads and moments (the DeepSeek-V3 recipes): 2 + 2 + (4 + 2 + 2). FSDP2 keeps the fp32 master as the
    # parameter: moments only. The Adam step moves 30 bytes per parameter in fp32, 20 with both in bf16.
    from meshplan.cost.dp import adam_bytes

    base = Plan(global_batch=1, seq_len=1, dp=8, zero=1)
    half = MEGATRON.with_(grad_dtype="bf16", optimizer_dtype="bf16")
    assert bytes_per_param(base, MEGATRON) == (2.0, 4.0, 12.0)
    assert bytes_per_param(base, half) == (2.0, 2.0, 8.0)
    assert bytes_per_param(base.with_(zero=3), half) == (4.0, 2.0, 4.0)
    assert (adam_bytes(MEGATRON), adam_bytes(half)) == (30.0, 20.0)


def test_mla_up_proj_recompute_frees_the_up_projected_qkv():
    # Megatron's mla_up_proj recompute discards q, k and v (heads x (2 x 192 + 128) 16-bit values per token on
    # DeepSeek-V3) after the attention core and keeps the compressed latents and the core's log-sum-exp.
    layer = catalog.model("deepseek-v3").blocks[-1].layer
    att = layer.attention
    plan = Plan(global_batch=8, seq_len=4096, recompute="selective")
    up_proj = MEGATRON.with_(selective_policy="mla_up_proj")
    none = act_bytes_per_token(layer, plan, up_proj, recompute="none")
    up = act_bytes_per_token(layer, plan, up_proj, recompute="selective")
    assert none - up == pytest.approx(2.0 * att.n_heads * (2 * att.qk_dim + att.v_dim)) == 2.0 * 128 * 512


def test_korthikanti_activations_with_sequence_parallel():
    # Korthikanti et al. 2022 Table 2, tp + sp, flash attention, no dropout: (34 - 2) s b h / t bytes per layer,
    # the 2 sbh of dropout masks absent; plus flash-attention's fp32 log-sum-exp (4 bytes x heads / t).
    layer = catalog.model("gpt3-175b").decoder
    t, h, a = 8, 12288, 96
    plan = Plan(global_batch=1, seq_len=2048, tp=t, sp=True)
    assert act_bytes_per_token(layer, plan, MEGATRON, recompute="none") == pytest.approx((32 * h + 4 * a) / t)
    # Full recompute keeps only the layer input: 2 s b h / t.
    assert act_bytes_per_token(layer, plan, MEGATRON, recompute="full") == pytest.approx(2 * h / t)


def test_ring_all_reduce_bus_factor():
    link = GroupLink(bandwidth=100e9, latency=0.0, level="nvlink")
    calib = Calibration(intra_eff=1.0)
    for n in (2, 4, 8):
        t = collective_time("all_reduce", 1e9, size=n, link=link, calib=calib)
        assert t == pytest.approx(2 * (n - 1) / n * 1e9 / 100e9)
        assert collective_time("all_gather", 1e9, size=n, link=link, calib=calib) == pytest.approx(t / 2)


def test_pcie_node_rings_at_the_measured_share_of_the_link():
    # A GPU without NVLink (L40S) reaches its node over PCIe; NCCL's ring there reaches 35/63 of the link on 4 GPUs
    # and 28/63 on 8 (NVIDIA/nccl#1639), whatever the NVLink efficiency says.
    gpu = catalog.gpu("l40s")
    pool = Pool(gpu=gpu, n_gpus=8, gpus_per_node=8)
    calib = Calibration(intra_eff=1.0)
    for n, share in ((2, 35 / 63), (4, 35 / 63), (8, 28 / 63)):
        link = group_link(pool, size=n, stride=1)
        assert link.level == "pcie"
        t = collective_time("all_reduce", 1e8, size=n, link=link, calib=calib)
        assert t == pytest.approx(2 * (n - 1) * link.latency + 2 * (n - 1) / n * 1e8 / (gpu.intra_bandwidth * share))
    assert group_link(Pool(gpu=catalog.gpu("h100-sxm"), n_gpus=8, gpus_per_node=8), size=8, stride=1).level == "nvlink"


def test_group_link_uses_nic_rails_across_nodes():
    gpu = catalog.gpu("h100-sxm")
    pool = Pool(gpu=gpu, n_gpus=64, gpus_per_node=8)
    inside = group_link(pool, size=8, stride=1)
    assert inside.bandwidth == gpu.intra_bandwidth
    across_one_rail = group_link(pool, size=8, stride=8)  # one member per node
    assert across_one_rail.bandwidth == gpu.nic_bandwidth
    across_two = group_link(pool, size=16, stride=4)  # two members per node drive two rails
    assert across_two.bandwidth == 2 * gpu.nic_bandwidth


def test_layer_params_gqa_swiglu():
    layer = catalog.model("llama3-8b").decoder
    dense, expert = layer_params(layer)
    h, f, kv = 4096, 14336, 8 * 128
    assert expert == 0
    assert dense == 2 * h * h + 2 * h * kv + 3 * h * f + 4 * h


def test_estimate_breakdown_sums_to_step_time():
    m, c = catalog.model("llama3-70b"), catalog.cluster("64xh100-sxm")
    p = Plan(global_batch=128, seq_len=8192, tp=4, sp=True, pp=4, vpp=5, cp=2, dp=2, zero=1, precision="fp8")
    e = estimate(m, c, p)
    assert e.time.total() == pytest.approx(e.step_time)
    assert e.tokens_per_s == pytest.approx(128 * 8192 / e.step_time)
    assert e.memory.total() == max(s.total() for s in e.memory_per_stage)


def test_mtp_adds_one_layer_and_one_logits_pass_per_depth():
    # DeepSeek-V3 sec. 2.2 / Megatron-Bridge flop_utils: each MTP depth is one more layer of the last block, an
    # eh projection 2h -> h and one more logits pass: 3 x (layer + 2 s (2h) h + 2 s h V) per sequence.
    from meshplan.calibrate.runs import with_mtp

    m = catalog.model("gpt3-175b")
    mtp = with_mtp(m, 1)
    assert mtp_depth(mtp) == 1 and mtp.n_layers == m.n_layers + 1
    s, h, V = 2048, 12288, 51200
    plan = Plan(global_batch=1, seq_len=s)
    layer = (model_flops(m, plan) - 3 * 2 * s * h * V) / m.n_layers
    assert model_flops(mtp, plan) - model_flops(m, plan) == pytest.approx(
        layer + 3 * (2 * s * 2 * h * h + 2 * s * h * V), rel=1e-12)


def test_fp8_sequence_parallel_forward_gathers_one_byte_per_element():
    # TE gathers the fp8 norm output (layernorm_linear.py): forward = AG(1 B) + RS(2 B) per tp collective pair;
    # the backward stays 16-bit.
    from meshplan.cost.comm import plan_links
    from meshplan.cost.ops import layer_ops
    from meshplan.cost.stage import Ctx, tp_comm
    from meshplan.spec.calibration import Calibration

    m, gpu = catalog.model("llama3-70b"), catalog.gpu("h100-sxm")
    pool, cal = Pool(gpu=gpu, n_gpus=8), Calibration()
    out = {}
    for prec in ("bf16", "fp8"):
        plan = Plan(global_batch=1, seq_len=8192, tp=8, sp=True, dp=1, precision=prec)
        ops = layer_ops(m.decoder, tokens=8192, plan=plan, stack=MEGATRON)
        ctx = Ctx(model=m, plan=plan, stack=MEGATRON, gpu=gpu, links=plan_links(plan, pool), calib=cal)
        out[prec] = tp_comm(m.decoder, ops, ctx, fwd_gemm=1.0, bwd_gemm=1.0)
    msg, link = 8192 * m.hidden * 2.0, plan_links(Plan(global_batch=1, seq_len=8192, tp=8, sp=True), pool).tp
    ag_saved = 2 * (collective_time("all_gather", msg, size=8, link=link, calib=cal)
                    - collective_time("all_gather", msg / 2, size=8, link=link, calib=cal))
    assert out["bf16"][0] - out["fp8"][0] == pytest.approx(ag_saved, rel=1e-9)
    assert out["fp8"][1] == pytest.approx(out["bf16"][1], rel=1e-12)


def test_logits_bytes_per_logit_by_runtime():
    m = catalog.model("llama3.1-8b")
    logits = 8192 * 128256
    # Megatron's fused cross-entropy 6 B; eager fp32 log-softmax + nll grad + log-softmax grad 12 B; torch's
    # loss_parallel (zeros_like + exp) * grad beside the saved log-softmax 16 B, on V / tp logits.
    assert logits_bytes(m, Plan(global_batch=8, seq_len=8192), MEGATRON) == pytest.approx(6 * logits)
    assert logits_bytes(m, Plan(global_batch=8, seq_len=8192), EAGER) == pytest.approx(12 * logits)
    loss_parallel = Plan(global_batch=8, seq_len=8192, tp=8)
    assert logits_bytes(m, loss_parallel, EAGER) == pytest.approx(16 * logits / 8)


def test_eager_vocab_parallel_embedding_gradient_is_whole():
    m = catalog.model("llama3.1-8b")
    plan = Plan(global_batch=8, seq_len=8192, tp=8, sp=True)
    # fp32, replicated over tp: 4 V h (1 - 1/8) = 1.71 GiB while micro-batches accumulate.
    assert embedding_grad_bytes(m, plan, EAGER) == pytest.approx(4 * 128256 * 4096 * 7 / 8)
    assert embedding_grad_bytes(m, dataclasses.replace(plan, global_batch=1), EAGER) == 0.0
    assert embedding_grad_bytes(m, plan, MEGATRON) == 0.0


def test_moe_eager_extra_bytes_by_hand():
    layer = catalog.model("qwen3-30b-a3b").blocks[0].layer
    # top-8 copies x (index_copy and index_add sources 2 x 2h + silu output 2f) + fp32 router softmax 4 E.
    plan = Plan(global_batch=8, seq_len=4096)
    assert moe_eager_extra_bytes(layer, plan) == 8 * (4 * 2048 + 2 * 768) + 4 * 128


def test_pipelined_gradients_beside_the_peak_activations():
    plan = Plan(global_batch=8, seq_len=4096, pp=4, dp=2, zero=3, schedule="1f1b")  # 4 micro-batches
    # Last stage (1 in flight, 4 micro-batches): the next forward brings the activations back beside them.
    assert pipelined_grads(plan, unsharded=10.0, act=3.0, act_one=3.0) == (10.0, 0.0)
    # First stage (4 in flight = all micro-batches): they replace the micro-batch the first backward frees.
    assert pipelined_grads(plan, unsharded=10.0, act=12.0, act_one=3.0) == (0.0, 7.0)
    # ... and beside them at its end, the 16-bit gradient of the unit FSDP2 casts into fp32.
    assert pipelined_grads(plan, unsharded=10.0, act=12.0, act_one=3.0, upcast=1.0) == (0.0, 8.0)
    gpipe = dataclasses.replace(plan, schedule="gpipe")
    assert pipelined_grads(gpipe, unsharded=2.0, act=12.0, act_one=3.0) == (0.0, 0.0)


def test_logits_and_the_recomputed_layer_do_not_add():
    m = catalog.model("llama3.1-8b")
    plan = Plan(global_batch=8, seq_len=8192, dp=8, zero=3, recompute="full", framework="meshplan")
    load = RankLoad(dense=1e9, expert=0.0, act=2e9, act_one=2e9, recompute=1e9, root=0.5e9, n_units=32,
                    first=True, last=True)
    mem = rank_memory(m, plan, EAGER, load, generation="hopper")
    # The loss backward (12 B per logit) ends before the last layer is recomputed: the larger one counts.
    assert mem.activations + mem.buffers == pytest.approx(2e9 + logits_bytes(m, plan, EAGER))
    assert mem.grads == 0.0  # FSDP2 has no gradients at the loss backward


def test_mla_up_proj_recompute_replays_the_up_projections_and_rope():
    # Megatron's recompute_modules=["mla_up_proj"] (multi_latent_attention.py, CheckpointWithoutOutput around
    # qkv_up_proj_and_rope_apply): the backward runs q_up, kv_up and RoPE once more; the core attention is kept.
    from meshplan.cost.comm import plan_links
    from meshplan.cost.compute import gemm_time, memory_time
    from meshplan.cost.ops import Gemm
    from meshplan.cost.stage import Ctx, layer_cost

    m, gpu = catalog.model("deepseek-v3"), catalog.gpu("b200")
    pool, cal = Pool(gpu=gpu, n_gpus=8), Calibration()
    block = m.blocks[-1]
    att, s = block.layer.attention, 4096
    cost = {}
    up_proj = MEGATRON.with_(selective_policy="mla_up_proj")
    for rec in ("none", "selective"):
        plan = Plan(global_batch=8, seq_len=s, dp=8, ep=8, recompute=rec)
        ctx = Ctx(model=m, plan=plan, stack=up_proj, gpu=gpu, links=plan_links(plan, pool), calib=cal)
        cost[rec] = layer_cost(block, ctx, index_on_rank=0)
    q_up = Gemm(name="q_up", m=s, n=att.n_heads * att.qk_dim, k=att.q_lora_rank)
    kv_up = Gemm(name="kv_up", m=s, n=att.n_heads * (att.head_dim + att.v_dim), k=att.kv_lora_rank)
    rope = s * 2 * (att.n_heads + att.n_kv_heads) * att.head_dim * 2.0  # q and k read and written, 2 bytes
    hand = sum(gemm_time(g, gpu=gpu, calib=cal, dtype="bf16") for g in (q_up, kv_up)) + memory_time(
        rope, gpu=gpu, calib=cal)
    assert cost["selective"].recompute == pytest.approx(hand, rel=1e-12)
    assert cost["selective"].bwd_input - cost["none"].bwd_input == pytest.approx(hand, rel=1e-12)
    # A GQA layer has no MLA up-projection: the policy recomputes nothing there.
    llama = catalog.model("llama3-8b")
    plan = Plan(global_batch=8, seq_len=s, dp=8, recompute="selective")
    ctx = Ctx(model=llama, plan=plan, stack=up_proj, gpu=gpu, links=plan_links(plan, pool), calib=cal)
    assert layer_cost(llama.blocks[0], ctx, index_on_rank=0).recompute == 0.0


def test_zero3_per_parameter_gathers_pay_latency_per_tensor():
    # DeepSpeed ZeRO-3 (2021): one all-gather per parameter tensor. Same bytes, but the ring latency
    # (n - 1 steps of the link latency) is paid once per tensor instead of once per layer.
    from meshplan.cost.comm import collective_time
    from meshplan.cost.dp import fsdp_cost
    from meshplan.spec.calibration import Calibration
    from meshplan.spec.cluster import GroupLink

    calib = Calibration(sync_s=0.0)
    link = GroupLink(level="fabric", bandwidth=25e9, latency=8e-6)
    links = type("L", (), {"dp_shard": link, "dp": link, "dp_replicate": link})()
    plan = Plan(global_batch=16, seq_len=2048, micro_batch=1, dp=16, zero=3)
    no_prefetch = MEGATRON.with_(overlap_param_gather=False)
    unit = fsdp_cost(1e9, 0.0, plan=plan, stack=no_prefetch, links=links, calib=calib, fwd=1.0, bwd=2.0,
                     n_units=10, n_tensors=120)
    per_param = fsdp_cost(1e9, 0.0, plan=plan, stack=no_prefetch.with_(zero_gather="param"), links=links,
                          calib=calib, fwd=1.0, bwd=2.0, n_units=10, n_tensors=120)
    one_gather = collective_time("all_gather", 2e9 / 10, size=16, link=link, calib=calib)
    assert unit.per_micro_fwd == pytest.approx(10 * one_gather)
    # 110 more gathers, each 15 ring steps x 8 us.
    assert per_param.per_micro_fwd - unit.per_micro_fwd == pytest.approx(110 * 15 * 8e-6)


def test_deepspeed_zero3_gathers_a_large_recomputed_layer_again_for_its_backward():
    """DeepSpeed ZeRO-3's module hooks fetch and release parameters around the recompute's forward too, and keep
    them for the backward only within max_reuse_distance (1e9 elements): a 1.8B-parameter layer under full
    recompute is gathered twice in its backward, a small one or FSDP2 once, and a layer without recompute once."""
    from meshplan.cost.dp import backward_gathers
    from meshplan.cost.memory_stack import DS_MAX_REUSE

    ds = catalog.framework("deepspeed-2021")
    plan = Plan(global_batch=16, seq_len=2048, micro_batch=1, dp=16, zero=3, recompute="full")
    assert backward_gathers(1.8e9, plan=plan, stack=ds) == 2
    assert backward_gathers(DS_MAX_REUSE / 2, plan=plan, stack=ds) == 1
    assert backward_gathers(1.8e9, plan=plan.with_(recompute="none"), stack=ds) == 1
    assert backward_gathers(1.8e9, plan=plan, stack=catalog.framework("torchtitan")) == 1


def test_float8_fsdp_all_gather_moves_one_byte_per_dense_weight():
    """torchao's float8 all-gather casts the dense weights' shards to fp8 before FSDP gathers them: the forward's
    gathers move half the bytes of a 16-bit plan, the reduce-scatter (fp32 gradients) is unchanged, and a bf16
    plan or a stack without the option gathers 16 bits."""
    from meshplan.cost.comm import collective_time
    from meshplan.cost.dp import fsdp_cost
    from meshplan.spec.calibration import Calibration
    from meshplan.spec.cluster import GroupLink

    calib = Calibration(sync_s=0.0)
    link = GroupLink(level="fabric", bandwidth=25e9, latency=8e-6)
    links = type("L", (), {"dp_shard": link, "dp": link, "dp_replicate": link})()
    plan = Plan(global_batch=16, seq_len=2048, micro_batch=1, dp=16, zero=3, precision="fp8")
    stack = MEGATRON.with_(overlap_param_gather=False, overlap_grad_reduce=False)

    def cost(p, st):
        return fsdp_cost(1e9, 0.0, plan=p, stack=st, links=links, calib=calib, fwd=1.0, bwd=2.0, n_units=10)

    fp8 = cost(plan, stack.with_(fp8_fsdp_gather=True))
    assert fp8.per_micro_fwd == pytest.approx(10 * collective_time("all_gather", 1e9 / 10, size=16, link=link,
                                                                    calib=calib))
    rs = 10 * collective_time("reduce_scatter", 4e9 / 10, size=16, link=link, calib=calib)
    assert fp8.per_micro_bwd == pytest.approx(fp8.per_micro_fwd + rs)
    sixteen = 10 * collective_time("all_gather", 2e9 / 10, size=16, link=link, calib=calib)
    assert cost(plan, stack).per_micro_fwd == pytest.approx(sixteen)
    assert cost(plan.with_(precision="bf16"), stack.with_(fp8_fsdp_gather=True)).per_micro_fwd == pytest.approx(
        sixteen)


@pytest.mark.parametrize(("dp_shard", "expert_group"), [(0, 2), (4, 1), (8, 1), (16, 2)])
def test_hsdp_shards_experts_in_proportion_to_dense(dp_shard, expert_group):
    """dp 16, ep 8: two ranks hold each expert shard. FSDP over all 16 splits the experts' states in two; an HSDP
    shard group of 8 keeps a whole expert copy per group (torchtitan's dp_shard_mod_ep = dp_shard / ep = 1), and
    one of 4 cannot split it further; the optimizer owns what memory holds."""
    from meshplan.cost.dp import owned_params

    plan = Plan(global_batch=64, seq_len=4096, dp=16, ep=8, zero=3, dp_shard=dp_shard)
    assert plan.expert_dp == 2
    assert plan.expert_zero_group == expert_group
    dense, expert = 1e9, 8e9
    assert owned_params(plan, dense=dense, expert=expert) == pytest.approx(
        dense / (dp_shard or 16) + expert / expert_group, rel=1e-12)
    assert owned_params(plan.with_(zero=0, dp_shard=0), dense=dense, expert=expert) == dense + expert


def test_zero2_reduce_scatters_every_micro_batch():
    """ZeRO-2 keeps gradients sharded while they accumulate, so each of the 4 micro-batches reduce-scatters its
    gradients (Megatron-FSDP optim_grads, DeepSpeed ZeRO-2); ZeRO-1 reduces once per step. Without overlap the
    step pays 4 reduce-scatters plus one parameter all-gather; a stack that accumulates FSDP2 gradients unsharded
    (meshplan's runtime) reduces once, and its memory holds the whole gradients instead."""
    from meshplan.cost.comm import collective_time
    from meshplan.cost.dp import ddp_cost
    from meshplan.cost.memory import sharded_state
    from meshplan.spec.calibration import Calibration
    from meshplan.spec.cluster import GroupLink

    calib = Calibration(sync_s=0.0)
    link = GroupLink(level="fabric", bandwidth=25e9, latency=8e-6, machines=2)
    links = type("L", (), {"dp_shard": link, "dp": link, "dp_replicate": link, "servers": None})()
    plan = Plan(global_batch=64, seq_len=2048, micro_batch=1, dp=16, zero=2)
    assert plan.n_micro == 4
    blocking = MEGATRON.with_(overlap_grad_reduce=False, overlap_param_gather=False)
    rs = collective_time("reduce_scatter", 1e9 * 4.0, size=16, link=link, calib=calib)
    ag = collective_time("all_gather", 1e9 * 2.0, size=16, link=link, calib=calib)
    z2 = ddp_cost(1e9, 0.0, plan=plan, stack=blocking, links=links, calib=calib, fwd=1.0, bwd=2.0)
    assert z2.per_micro_bwd == pytest.approx(rs) and z2.per_step == pytest.approx(ag)
    assert z2.total_traffic == pytest.approx(4 * rs + ag)
    z1 = ddp_cost(1e9, 0.0, plan=plan.with_(zero=1), stack=blocking, links=links, calib=calib, fwd=1.0, bwd=2.0)
    assert z1.per_micro_bwd == 0.0 and z1.per_step == pytest.approx(rs + ag)
    unsharded = catalog.framework("meshplan").with_(overlap_grad_reduce=False, overlap_param_gather=False)
    once = ddp_cost(1e9, 0.0, plan=plan, stack=unsharded, links=links, calib=calib, fwd=1.0, bwd=2.0)
    assert once.per_micro_bwd == 0.0
    # One micro-batch: nothing to accumulate, one reduction either way.
    single = plan.with_(global_batch=16)
    assert ddp_cost(1e9, 0.0, plan=single, stack=blocking, links=links, calib=calib, fwd=1.0,
                    bwd=2.0).per_micro_bwd == 0.0
    assert sharded_state(plan, blocking, dense=1e9, expert=0.0)[1] == pytest.approx(1e9 * 4.0 / 16)
