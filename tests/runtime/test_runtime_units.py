"""Pure pieces of the runtime, without process groups: mesh layout, data, stage placement, seeded weights."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from meshplan import catalog  # noqa: E402
from meshplan.cost.memory import layer_params  # noqa: E402
from meshplan.errors import SpecError  # noqa: E402
from meshplan.runtime.data import Source, cp_positions, decode, dp_slice, encode  # noqa: E402
from meshplan.runtime.mesh import mesh_layout  # noqa: E402
from meshplan.runtime.models.decoder import build_decoder  # noqa: E402
from meshplan.runtime.parallelize import check_runtime_support  # noqa: E402
from meshplan.runtime.pipeline import pipeline_violations, stage_layers, stages_of_rank  # noqa: E402
from meshplan.spec.model import decoder_model  # noqa: E402
from meshplan.spec.plan import Plan  # noqa: E402


def _plan(**kw) -> Plan:
    return Plan(**{"global_batch": 8, "seq_len": 32, **kw})


def test_mesh_follows_the_rank_order_slowest_first():
    plan = _plan(tp=2, dp=4, zero=3, dp_shard=2, pp=2)
    assert mesh_layout(plan) == (("pp", "dp_replicate", "dp_shard", "cp", "tp"), (2, 2, 2, 1, 2))
    swapped = plan.with_(rank_order="dp-tp-cp-ep-pp")
    assert mesh_layout(swapped) == (("pp", "cp", "tp", "dp_replicate", "dp_shard"), (2, 1, 2, 2, 2))


def test_zero0_replicates_over_all_of_dp():
    assert mesh_layout(_plan(dp=4))[1] == (1, 4, 1, 1, 1)


def test_cp_positions_zigzag():
    assert cp_positions(8, cp_rank=0, cp=2).tolist() == [0, 1, 6, 7]
    assert cp_positions(8, cp_rank=1, cp=2).tolist() == [2, 3, 4, 5]
    assert cp_positions(4, cp_rank=0, cp=1).tolist() == [0, 1, 2, 3]
    assert cp_positions(8, cp_rank=1, cp=2, zigzag=False).tolist() == [4, 5, 6, 7]  # all-to-all cp


def test_batches_depend_on_seed_and_step_only():
    src = Source(kind="corpus", vocab=256, seed=3)
    a, b = src.batch(step=5, batch=4, seq_len=16), src.batch(step=5, batch=4, seq_len=16)
    assert torch.equal(a[0], b[0]) and torch.equal(a[0][:, 1:], a[1][:, :-1])
    assert not torch.equal(a[0], src.batch(step=6, batch=4, seq_len=16)[0])
    assert dp_slice(a[0], dp_rank=1, dp=2).shape == (2, 16)
    assert decode(encode("naïve")) == "naïve"


def test_synthetic_stream_is_arithmetic_mod_vocab():
    x, y = Source(kind="synthetic", vocab=256).batch(step=1, batch=2, seq_len=8)
    d = (x[:, 1:] - x[:, :-1]) % 256
    assert (d == d[:, :1]).all() and ((y - x) % 256 == d[:, :1]).all()


def test_stage_placement_loop_v_and_layers():
    model = catalog.model("tiny-llama")
    loop = _plan(pp=2, vpp=2, schedule="interleaved_1f1b")
    assert stages_of_rank(loop, 0) == (0, 2) and stages_of_rank(loop, 1) == (1, 3)
    vee = _plan(pp=2, vpp=2, schedule="zbv")
    assert stages_of_rank(vee, 0) == (0, 3) and stages_of_rank(vee, 1) == (1, 2)
    assert [stage_layers(model, loop, s) for s in range(4)] == [(0,), (1,), (2,), (3,)]
    assert stage_layers(model, _plan(pp=2), 1) == (2, 3)


def test_schedule_problems_are_sentences():
    assert "runs exactly 2 chunk(s) per rank" in pipeline_violations(_plan(pp=2, schedule="dualpipev"))[0]
    with pytest.raises(SpecError, match="unknown schedule"):
        _plan(pp=2, schedule="zb2p")
    assert "use looped_bfs for vpp=2" in pipeline_violations(_plan(pp=2, vpp=2, schedule="gpipe"))[0]
    assert pipeline_violations(_plan(pp=2, vpp=2, schedule="looped_bfs")) == []
    assert pipeline_violations(_plan(pp=2, schedule="zb_h1")) == []


def test_seeded_weights_do_not_depend_on_the_layout():
    spec = catalog.model("tiny-llama")
    full = dict(build_decoder(spec, seed=7).named_parameters())
    stage = dict(build_decoder(spec, layer_ids=(2, 3), first=False, seed=7).named_parameters())
    assert set(stage) < set(full) and "layers.2.attention.wq.weight" in stage
    assert all(torch.equal(stage[k], full[k]) for k in stage)
    other = build_decoder(spec, seed=8).layers["0"].attention.wq.weight
    assert not torch.equal(full["layers.0.attention.wq.weight"], other)


def _mla(**kw):
    return decoder_model(name="mla", n_layers=2, hidden=64, n_heads=4, n_kv_heads=4, head_dim=16, ffn_hidden=128,
                         vocab=256, attention_kind="mla", kv_lora_rank=16, qk_rope_head_dim=8, v_head_dim=12, **kw)


def test_mla_parameters_match_the_hand_count_and_the_cost_model():
    spec = _mla(q_lora_rank=32)
    att = build_decoder(spec).layers["0"].attention
    # wq_a 64*32, q_norm 32, wq_b 32*4*(16+8), wkv_a 64*(16+8), kv_norm 16, wkv_b 16*4*(16+12), wo 4*12*64
    assert sum(p.numel() for p in att.parameters()) == 2048 + 32 + 3072 + 1536 + 16 + 1792 + 3072
    dense = layer_params(spec.decoder)[0] - 4 * 64 - 3 * 64 * 128  # less the two norms and the SwiGLU
    assert dense == 11568 - 32 - 16  # the cost model leaves MLA's two latent norms out


def test_mla_is_causal():
    model = build_decoder(_mla())
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    changed = x.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 256
    a, b = model(x), model(changed)
    assert torch.equal(a[:, :10], b[:, :10]) and not torch.allclose(a[:, 10:], b[:, 10:])


def test_runtime_accepts_every_layout_the_planner_can_choose_and_says_why_not_otherwise():
    llama, moe, gpt = catalog.model("tiny-llama"), catalog.model("tiny-moe"), catalog.model("tiny-gpt")
    for spec, plan in ((llama, _plan(cp=2, cp_kind="a2a")), (_mla(), _plan(tp=2, cp=2)), (llama, _plan(tp=4)),
                       (moe, _plan(tp=2, ep=2)), (moe, _plan(tp=2, etp=2)), (moe, _plan(dp=2, tp=2, ep=4)),
                       (gpt, _plan(pp=2)), (gpt, _plan(tp=2, cp=2, sp=True)), (gpt, _plan(tp=2, pp=2))):
        assert check_runtime_support(spec, plan) == [], plan
    assert check_runtime_support(moe, _plan(tp=4, etp=2)) == [
        "etp=2: the runtime shards experts over the whole tp group (etp=1 or etp=tp=4)"]
    assert check_runtime_support(moe, _plan(tp=2, etp=2, ep=4, dp=2)) == [
        "with etp=tp the experts fold inside cp*dp: ep=4 must divide cp*dp=2"]



def test_runtime_refuses_stack_settings_it_cannot_honour():
    # The runtime is the meshplan stack: it can step AdamW per tensor or with foreach, nothing else changes.
    from meshplan.errors import PlanError
    from meshplan.runtime.config import RunConfig
    from meshplan.runtime.launch import unsupported_settings, validate

    mine = catalog.framework("meshplan")
    assert unsupported_settings(mine.with_(fused_optimizer=False)) == []
    assert unsupported_settings(mine.with_(optimizer_dtype="bf16", selective_policy="op")) == [
        "selective_policy=op: meshplan's runtime keeps selective_policy=attention",
        "optimizer_dtype=bf16: meshplan's runtime keeps optimizer_dtype=fp32"]
    with pytest.raises(PlanError, match="grad_dtype=bf16"):
        validate(RunConfig(plan=_plan(dp=2), model="tiny-llama", stack=mine.with_(grad_dtype="bf16")), 2)
    with pytest.raises(Exception, match="runtime is the meshplan stack"):
        RunConfig(plan=_plan(), model="tiny-llama", stack=catalog.framework("torchtitan"))
