"""Every parallelism trains the same tiny model with exactly the single-process reference's losses and gradient
norms (fp32): dense GQA, GPT-style tied embeddings, MoE and MLA models under every layout the planner can choose."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from runtime_helpers import TOL, check_ok, config, grad_norms, launch, losses

from meshplan import catalog
from meshplan.runtime.train import reference_rows
from meshplan.spec.model import MoESpec, decoder_model

pytestmark = pytest.mark.runtime

NORM_RTOL = 1e-5
"""Largest relative gradient-norm error accepted in fp32 (Adam hides a gradient's scale from the loss; the norm
does not)."""

MLA = {"name": "tiny-mla", "n_layers": 4, "hidden": 64, "n_heads": 4, "n_kv_heads": 4, "head_dim": 16,
       "ffn_hidden": 128, "vocab": 256, "attention_kind": "mla", "kv_lora_rank": 16, "qk_rope_head_dim": 8,
       "v_head_dim": 12}
"""A DeepSeek-style MLA model: 16 non-RoPE + 8 RoPE query/key dims, 12 value dims, a 16-wide kv latent."""

DEEPSEEK = {**MLA, "name": "tiny-deepseek", "n_layers": 3, "q_lora_rank": 32, "first_dense": 1, "ffn_hidden": 32,
            "dense_ffn_hidden": 128, "moe": {"n_experts": 4, "top_k": 2, "expert_ffn_hidden": 32,
                                             "n_shared_experts": 1}}
"""A tiny DeepSeek-V3: MLA with query compression, one dense layer, then MoE layers with a shared expert."""


def _model_file(tmp_path, d: dict) -> str:
    """Write a short-form model as a model file (checked against decoder_model); returns its path."""
    path = tmp_path / f"{d['name']}.json"
    path.write_text(json.dumps(d))
    kw = {**d, "moe": MoESpec(**d["moe"])} if "moe" in d else d
    assert catalog.model(str(path)) == decoder_model(**kw)
    return str(path)


def _mla_model(tmp_path, *, q_lora_rank: int = 0) -> str:
    """The tiny MLA model (with query compression when q_lora_rank > 0) as a model file."""
    return _model_file(tmp_path, {**MLA, **({"q_lora_rank": q_lora_rank, "name": "tiny-mla-q"} if q_lora_rank else {})})


def _assert_match(cfgs) -> None:
    refs: dict = {}
    for cfg in cfgs:
        key = (cfg.model, cfg.plan.global_batch, cfg.plan.seq_len, cfg.steps)
        if key not in refs:
            refs[key] = reference_rows(cfg)
        ref_loss = [r["loss"] for r in refs[key]]
        got = losses(cfg)
        assert len(got) == cfg.steps, cfg.extra
        worst = max(abs(a - b) for a, b in zip(got, ref_loss))
        assert worst < TOL, f"{cfg.out_dir}: {got} vs reference {ref_loss}"
        norms = grad_norms(cfg)
        worst = max(abs(a / r["grad_norm"] - 1) for a, r in zip(norms, refs[key]))
        assert worst < NORM_RTOL, f"{cfg.out_dir}: grad norms {norms} vs reference {refs[key]}"


def test_two_processes_dp_fsdp_pp_cp(tmp_path):
    mla, ds = _mla_model(tmp_path), _model_file(tmp_path, DEEPSEEK)  # MLA with q_lora under TP: the MLA chain
    sched_csv = tmp_path / "gpipe_like.csv"
    sched_csv.write_text("0F0,0F1,0F2,0F3,0B0,0B1,0B2,0B3\n1F0,1F1,1F2,1F3,1B0,1B1,1B2,1B3\n")
    cfgs = [
        config(tmp_path, "ddp", dp=2),
        config(tmp_path, "fsdp", dp=2, zero=3),
        config(tmp_path, "zero1", dp=2, zero=1),
        config(tmp_path, "zero2_accum", dp=2, zero=2, global_batch=8, micro_batch=2, steps=2),
        config(tmp_path, "cp_ring", cp=2, recompute="selective"),
        config(tmp_path, "pp_csv", pp=2, schedule=str(sched_csv)),
        config(tmp_path, "cp_a2a", cp=2, cp_kind="a2a"),
        config(tmp_path, "tied_pp", model="tiny-gpt", pp=2, schedule="1f1b"),
        config(tmp_path, "tied_zbv", model="tiny-gpt", pp=2, vpp=2, schedule="zbv"),  # one rank holds both copies
        config(tmp_path, "mla_ring", model=mla, cp=2),
        config(tmp_path, "mla_a2a", model=mla, cp=2, cp_kind="a2a", recompute="selective"),
        config(tmp_path, "moe_ep_over_tp", model="tiny-moe", tp=2, sp=True, ep=2),
        config(tmp_path, "moe_etp", model="tiny-moe", tp=2, etp=2),
        config(tmp_path, "gpt_tp_sp", model="tiny-gpt", tp=2, sp=True),  # tied vocab-parallel head, learned positions
        config(tmp_path, "gpt_cp", model="tiny-gpt", cp=2),
        config(tmp_path, "deepseek_ep_tp", model=ds, tp=2, sp=True, ep=2),
        config(tmp_path, "deepseek_etp", model=ds, tp=2, etp=2),
    ]
    for name in ("gpipe", "1f1b", "zb_h1"):
        cfgs.append(config(tmp_path, f"pp_{name}", pp=2, schedule=name, recompute="full"))
    for name in ("interleaved_1f1b", "looped_bfs", "zbv", "dualpipev"):
        cfgs.append(config(tmp_path, f"pp_{name}", pp=2, vpp=2, schedule=name))
    # Two steps each: the second checks the optimizer's update as well as the first step's gradients.
    cfgs = [replace(c, steps=2) for c in cfgs]
    check_ok(launch(cfgs, nproc=2, tmp=tmp_path))
    _assert_match(cfgs)


# The 4-process layouts (HSDP, TP+SP with FSDP or ZeRO-1 and recompute, CP ring and all-to-all, another rank
# order, kv heads replicated over tp, EP over dp, pp, cp or not in dp, etp, MLA with tp, tied embeddings under
# pp) train inside the live-switch chains of test_runtime_switch.py, which check the same losses and gradient
# norms against the reference at every step, and every switch between them.


def test_eight_processes_three_d(tmp_path):
    cfgs = [
        config(tmp_path, "pp_fsdp_tp", pp=2, dp=2, zero=3, tp=2, sp=True),
        config(tmp_path, "pp_cp_dp", pp=2, vpp=2, schedule="interleaved_1f1b", dp=2, cp=2, zero=2),
    ]
    check_ok(launch(cfgs, nproc=8, tmp=tmp_path))
    _assert_match(cfgs)
