"""Exporters: registry, concrete values per framework, approximations and exit codes, golden files."""

from __future__ import annotations

import json
import os
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from meshplan import catalog
from meshplan.cli.export import APPROXIMATE_EXIT, run_export
from meshplan.errors import SpecError
from meshplan.export.base import ExportError, exporters, get_exporter, render_export
from meshplan.export.layout import first_last_split
from meshplan.export.megatron import layout_string, megatron_args
from meshplan.export.torchtitan import stage_fqns
from meshplan.spec.plan import Plan
from meshplan.spec.plan_file import read_plan_file

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
PLANS = sorted(p.stem for p in (GOLDEN / "plans").glob("*.toml"))
OUTPUTS = (("megatron", "sh"), ("torchtitan", "toml"), ("torchtitan", "python"), ("deepspeed", "sh"))


MEGATRON = catalog.framework("megatron-core")


def load(name: str, path: Path | None = None):
    plan, refs = read_plan_file(path or GOLDEN / "plans" / f"{name}.toml")
    return catalog.model(refs["model"]), plan, refs["gpus"], catalog.framework_with(plan.framework,
                                                                                    refs.get("framework"))


def render(name: str, to: str, fmt: str = "", path: Path | None = None):
    model, plan, gpus, stack = load(name, path)
    return render_export(get_exporter(to), model, plan, stack, gpus=gpus, fmt=fmt)


def refused(plan: Plan, to: str) -> bool:
    """DeepSpeed's PipelineEngine refuses ZeRO-2/3 under pipeline parallelism: no export is written."""
    return to == "deepspeed" and plan.pp > 1 and plan.zero > 1


def bash_array(text: str, var: str) -> list[str]:
    """The words of ``VAR=( ... )`` in an exported bash file."""
    body = re.search(rf"^{var}=\((.*?)^\)", text, re.S | re.M).group(1)
    return shlex.split(body)


def flag_model(name: str):
    """A catalog model; ``+mtp`` adds DeepSeek-V3's one MTP module (config.json num_nextn_predict_layers)."""
    base, _, mtp = name.partition("+")
    return catalog.model(base).with_mtp(1) if mtp else catalog.model(base)


def flag_values(words: list[str]) -> dict[str, str | None]:
    out, i = {}, 0
    while i < len(words):
        if i + 1 < len(words) and not words[i + 1].startswith("--"):
            out[words[i]] = words[i + 1]
            i += 2
        else:
            out[words[i]] = None
            i += 1
    return out


def heredoc_json(text: str) -> dict:
    return json.loads(re.search(r"<<'JSON'\n(.*?)\nJSON\n", text, re.S).group(1))


# ---------------------------------------------------------------- registry
def test_registry_names_and_close_match_error():
    assert sorted(exporters()) == ["deepspeed", "megatron", "torchtitan"]
    with pytest.raises(SpecError) as exc:
        get_exporter("megatronn")
    assert "megatron" in exc.value.suggestions


def test_unknown_format_is_an_error():
    with pytest.raises(SpecError, match="toml, python"):
        render("tt2412-t3-8b-fsdp-128g", "torchtitan", fmt="yaml")


def test_golden_plans_cover_required_layouts():
    plans = [load(n)[1] for n in PLANS]
    assert len(plans) >= 5
    assert any(p.vpp > 1 for p in plans) and any(p.cp > 1 for p in plans)
    assert any(p.ep > 1 for p in plans) and any(p.zero == 3 for p in plans)


# ---------------------------------------------------------------- megatron
def test_megatron_gpt3_175b_interleaved():
    res = render("dgxc-gpt-3-175b-bf16-256g", "megatron")
    flags = flag_values(bash_array(res.text, "MEGATRON_ARGS"))
    assert flags["--tensor-model-parallel-size"] == "4"
    assert flags["--pipeline-model-parallel-size"] == "8"
    assert flags["--num-layers-per-virtual-pipeline-stage"] == "1"  # 96 layers / (8 * 12)
    assert flags["--num-layers"] == "96" and flags["--hidden-size"] == "12288"
    assert flags["--position-embedding-type"] == "learned_absolute"
    assert flags["--normalization"] == "LayerNorm"
    assert "--sequence-parallel" in flags and "--use-distributed-optimizer" in flags and "--bf16" in flags
    assert "--untie-embeddings-and-output-weights" not in flags  # GPT-3 ties them
    assert "--swiglu" not in flags and "--disable-bias-linear" not in flags
    assert flags["--global-batch-size"] == "512" and flags["--micro-batch-size"] == "1"
    assert res.exact


def test_megatron_llama70b_context_parallel_and_gqa():
    flags = flag_values(bash_array(render("dgxc-llama-3-1-70b-bf16-64g", "megatron").text, "MEGATRON_ARGS"))
    assert flags["--context-parallel-size"] == "2" and flags["--cp-comm-type"] == "p2p"
    assert flags["--num-query-groups"] == "8" and "--group-query-attention" in flags
    assert flags["--num-layers-per-virtual-pipeline-stage"] == "4"  # 80 / (4 * 5)
    assert "--swiglu" in flags and flags["--normalization"] == "RMSNorm"


def test_megatron_deepseek_mla_moe_layout():
    res = render("mbridge2511-deepseek-v3-b200-256g", "megatron")
    flags = flag_values(bash_array(res.text, "MEGATRON_ARGS"))
    assert flags["--num-experts"] == "256" and flags["--moe-router-topk"] == "8"
    assert flags["--moe-ffn-hidden-size"] == "2048" and flags["--ffn-hidden-size"] == "18432"
    assert flags["--moe-layer-freq"] == "([0]*3+[1]*58)"
    assert flags["--moe-shared-expert-intermediate-size"] == "2048"
    assert flags["--expert-model-parallel-size"] == "8"
    assert flags["--kv-lora-rank"] == "512" and flags["--q-lora-rank"] == "1536"
    assert flags["--qk-pos-emb-head-dim"] == "64" and "--multi-latent-attention" in flags
    assert flags["--fp8-format"] == "hybrid"
    # 61 layers on 16 stages: 3 on the ends, 4 on 13 middle stages, 3 on stage 14 (even_split), so the
    # middle stages differ and the layout string is used
    assert flags["--pipeline-model-parallel-layout"] == "Et*3|" + "t*4|" * 13 + "t*3|t*3L"


def test_megatron_grok_geglu_is_approximate():
    res = render("dgxc-grok-1-314b-bf16-1024g", "megatron")
    assert len(res.approximations) == 1 and "GeGLU" in res.approximations[0]
    assert "# APPROXIMATE" in res.text and "GeGLU" in res.text


def test_megatron_first_last_split_and_layout():
    model = catalog.model("llama3-8b")
    plan = Plan(global_batch=8, seq_len=1024, pp=4, dp=2, layer_split=(7, 9, 9, 7))
    words = sum(([f] if v is None else [f, str(v)] for f, v in megatron_args(model, plan, MEGATRON)[0]), [])
    flags = flag_values(words)
    assert flags["--decoder-first-pipeline-num-layers"] == "7"
    assert flags["--decoder-last-pipeline-num-layers"] == "7"
    assert first_last_split((7, 9, 10, 6)) is None
    assert layout_string((3, 4, 0, 2)) == "Et*3|t*4||t*2L"


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev", "gpipe"])
def test_megatron_schedules_it_lacks_are_approximations(schedule):
    model = catalog.model("llama3-8b")
    plan = Plan(global_batch=16, seq_len=1024, pp=4, vpp=2 if schedule != "gpipe" else 1, dp=2, schedule=schedule)
    notes = megatron_args(model, plan, MEGATRON)[1]
    assert len(notes) == 1 and schedule in notes[0]


def test_megatron_zero3_uses_megatron_fsdp():
    model = catalog.model("llama3-8b")
    args = dict(megatron_args(model, Plan(global_batch=16, seq_len=1024, dp=8, zero=3, dp_shard=4), MEGATRON)[0])
    assert args["--data-parallel-sharding-strategy"] == "optim_grads_params"
    assert "--use-megatron-fsdp" in args and args["--num-distributed-optimizer-instances"] == 2


@pytest.mark.parametrize("sp", [True, False])
def test_tp_comm_overlap_is_exported_or_flagged(sp):
    # Megatron needs sequence parallelism for --tp-comm-overlap; torchtitan runs it as AsyncTP (with compile);
    # Megatron-DeepSpeed has none, so its export says so.
    model, plan = catalog.model("llama3-8b"), Plan(global_batch=64, seq_len=4096, tp=8, sp=sp, dp=1)
    stack = MEGATRON.with_(tp_comm_overlap=True)
    args, notes = megatron_args(model, plan, stack)
    assert ("--tp-comm-overlap" in dict(args)) == sp and any("overlap" in n for n in notes) != sp
    ds = render_export(get_exporter("deepspeed"), model, plan, stack)
    assert any("TP communication overlap" in n for n in ds.approximations)
    titan = tomllib.loads(render_export(get_exporter("torchtitan"), model, plan, stack).text)
    assert titan["parallelism"]["enable_async_tensor_parallel"] and titan["compile"]["enable"]


def test_deepspeed_refuses_zero2_with_pipeline(tmp_path, capsys):
    from meshplan.cli import main

    plan = Plan(global_batch=64, seq_len=4096, pp=4, dp=2, zero=2)
    with pytest.raises(ExportError, match="ZeRO-2 with pp=4.*ZeRO-1 at most"):
        render_export(get_exporter("deepspeed"), catalog.model("llama3-8b"), plan, MEGATRON)
    plan_file = GOLDEN / "plans" / "tt2412-t5-405b-interleaved1f1b-512g.toml"  # FSDP with pp 8
    out = tmp_path / "ds.sh"
    assert main(["export", str(plan_file), "--to", "deepspeed", "-o", str(out), "--allow-approximate"]) == 2
    assert "ZeRO-3 with pp=8" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("policy", ["attention", "op", "mla_up_proj"])
def test_selective_policy_is_exported_or_flagged(policy):
    # Megatron expresses the attention core (its default) and --recompute-modules mla_up_proj; torchtitan only
    # its per-op policy; Megatron-DeepSpeed only the attention core. Everything else is an approximation.
    from meshplan.export.deepspeed import mds_args
    from meshplan.export.torchtitan import activation_checkpoint

    model = catalog.model("deepseek-v3")
    plan = Plan(global_batch=64, seq_len=4096, pp=4, dp=1, recompute="selective")
    stack = MEGATRON.with_(selective_policy=policy)
    args, notes = megatron_args(model, plan, stack)
    assert dict(args)["--recompute-granularity"] == "selective"
    assert (dict(args).get("--recompute-modules") == "mla_up_proj") == (policy == "mla_up_proj")
    assert any("per-op policy" in n for n in notes) == (policy == "op")
    section, titan_notes = activation_checkpoint(model, plan, stack)
    assert section == {"mode": "selective", "selective_ac_option": "op"} and bool(titan_notes) == (policy != "op")
    assert any("policy" in n for n in mds_args(model, plan, stack)[1]) == (policy != "attention")


@pytest.mark.parametrize("fused", [True, False])
def test_optimizer_kernels_are_exported_or_flagged(fused):
    # torchtitan names its AdamW implementation; Megatron-LM and DeepSpeed always run a multi-tensor Adam.
    from meshplan.export.deepspeed import ds_config
    from meshplan.export.torchtitan import job_sections

    model = catalog.model("llama3-8b")
    plan, stack = Plan(global_batch=64, seq_len=4096, dp=8, zero=1), MEGATRON.with_(fused_optimizer=fused)
    doc, _ = job_sections(model, plan, stack)
    assert doc["optimizer"] == {"name": "AdamW", "implementation": "fused" if fused else "for-loop"}
    assert any("fused_optimizer" in n for n in megatron_args(model, plan, stack)[1]) != fused
    assert any("fused_optimizer" in n for n in ds_config(plan, stack)[1]) != fused


def test_optimizer_precision_is_exported_or_flagged():
    # Megatron-LM's precision-aware optimizer carries bf16 main grads and moments; DeepSpeed only the gradient
    # accumulation dtype; torchtitan neither.
    from meshplan.export.deepspeed import ds_config
    from meshplan.export.torchtitan import training

    plan = Plan(global_batch=64, seq_len=4096, dp=8, zero=1)
    half = MEGATRON.with_(grad_dtype="bf16", optimizer_dtype="bf16")
    args, notes = megatron_args(catalog.model("llama3-8b"), plan, half)
    d = dict(args)
    assert "--use-precision-aware-optimizer" in d and d["--main-grads-dtype"] == "bf16"
    assert d["--exp-avg-dtype"] == d["--exp-avg-sq-dtype"] == "bf16" and not notes
    cfg, ds_notes = ds_config(plan, half)
    assert cfg["data_types"] == {"grad_accum_dtype": "bf16"} and any("optimizer_dtype" in n for n in ds_notes)
    assert any("optimizer_dtype" in n for n in training(plan, half)[1])
    assert "--use-precision-aware-optimizer" not in dict(megatron_args(catalog.model("llama3-8b"),
                                                                       Plan(global_batch=64, seq_len=4096),
                                                                       MEGATRON)[0])
    # bf16 gradient buffers alone (the performance recipes' grad_reduce_in_fp32 = False) are Megatron-LM's
    # --grad-reduce-in-bf16, as its Llama examples pass it, with no precision-aware optimizer; fp8 weights are
    # --fp8-param-gather.
    d = dict(megatron_args(catalog.model("llama3-8b"), plan.with_(precision="fp8"),
                           MEGATRON.with_(grad_dtype="bf16", fp8_params=True))[0])
    assert "--grad-reduce-in-bf16" in d and "--fp8-param-gather" in d and "--use-precision-aware-optimizer" not in d


# ---------------------------------------------------------------- torchtitan
def test_torchtitan_fsdp_toml():
    res = render("tt2412-t3-8b-fsdp-128g", "torchtitan")
    doc = tomllib.loads(res.text)
    assert doc["model"] == {"name": "llama3", "flavor": "8B"}
    assert doc["parallelism"]["data_parallel_shard_degree"] == 128
    assert doc["parallelism"]["data_parallel_replicate_degree"] == 1
    assert doc["training"]["local_batch_size"] == 2 and doc["training"]["global_batch_size"] == 256
    assert doc["training"]["seq_len"] == 8192
    assert doc["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    # torchtitan's own stack and its per-op policy; only its 8B flavor's RoPE is Llama 3.1's, not Llama 3's
    assert len(res.approximations) == 1 and "Llama 3.1" not in res.approximations[0]
    assert "llama3 scaling x8" in res.approximations[0]


def test_torchtitan_405b_interleaved_pipeline_fp8():
    doc = tomllib.loads(render("tt2412-t5-405b-interleaved1f1b-512g", "torchtitan").text)
    par = doc["parallelism"]
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert par["pipeline_parallel_degree"] == 8 and par["tensor_parallel_degree"] == 8
    assert par["data_parallel_shard_degree"] == 8
    parts = par["module_fqns_per_model_part"]
    assert len(parts) == 16 and parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]
    assert sum(len([m for m in p if m.startswith("layers.")]) for p in parts) == 126
    # with pp every micro-batch of a step runs inside one pipeline step: 256 / dp 8 = 32
    assert doc["training"]["local_batch_size"] == 32 and par["pipeline_parallel_microbatch_size"] == 1
    assert doc["model"]["converters"] == ["quantize.linear.float8"]
    assert doc["quantize"]["linear"]["float8"]["enable_fsdp_float8_all_gather"] is True
    assert doc["activation_checkpoint"] == {"mode": "full"}


def test_torchtitan_grok_ep_and_unknown_flavor():
    res = render("dgxc-grok-1-314b-bf16-1024g", "torchtitan")
    doc = tomllib.loads(res.text)
    assert doc["parallelism"]["expert_parallel_degree"] == 8
    assert doc["parallelism"]["context_parallel_degree"] == 2
    assert doc["parallelism"]["data_parallel_shard_degree"] == 16
    assert doc["parallelism"]["fsdp_reshard_after_forward"] == "never"
    assert any("grok-1-314b" in n for n in res.approximations)
    assert any("ZeRO-1" in n for n in res.approximations)


def test_torchtitan_python_layout():
    res = render("tt2412-t5-405b-interleaved1f1b-512g", "torchtitan", fmt="python")
    assert "from torchtitan.models.llama3.config_registry import llama3_405b" in res.text
    assert "pipeline_parallel_schedule='Interleaved1F1B'" in res.text
    assert "'lm_head']" in res.text and "Float8LinearConverter.Config" in res.text
    assert "config.activation_checkpoint = FullAC.Config()" in res.text
    compile(res.text, "export.py", "exec")


@pytest.mark.parametrize("to,fmt", OUTPUTS)
def test_every_export_names_its_target_release(to, fmt):
    assert re.search(r"^# target: .*\d+\.\d+\.\d+", render("dgxc-llama-3-1-70b-bf16-64g", to, fmt).text, re.M)


def test_stage_fqns():
    assert stage_fqns((2, 1), head="output") == [["tok_embeddings", "layers.0", "layers.1"],
                                                 ["layers.2", "norm", "output"]]


def test_torchtitan_csv_schedule():
    model = catalog.model("llama3-8b")
    plan = Plan(global_batch=16, seq_len=1024, pp=4, vpp=2, dp=2, schedule="my_sched.csv", framework="torchtitan")
    res = get_exporter("torchtitan").render(model, plan, catalog.framework("torchtitan"))
    par = tomllib.loads(res.text)["parallelism"]
    assert par["pipeline_parallel_schedule_csv"] == "my_sched.csv"
    assert par["pipeline_parallel_schedule"] == "PipelineScheduleMulti"


# ---------------------------------------------------------------- deepspeed
def test_deepspeed_json_and_launch_args():
    res = render("dgxc-llama-3-1-70b-bf16-64g", "deepspeed")
    cfg = heredoc_json(res.text)
    assert cfg["train_batch_size"] == 128 and cfg["train_micro_batch_size_per_gpu"] == 1
    assert cfg["gradient_accumulation_steps"] == 128 // (2 * 1)  # global / (dp * micro)
    assert cfg["zero_optimization"]["stage"] == 1 and cfg["bf16"] == {"enabled": True}
    flags = flag_values(bash_array(res.text, "MDS_ARGS"))
    assert flags["--tensor-model-parallel-size"] == "4" and flags["--pipeline-model-parallel-size"] == "4"
    assert flags["--num-key-value-heads"] == "8" and flags["--zero-stage"] == "1"
    assert flags["--ds-sequence-parallel-size"] == "2"
    assert any("ring context parallel" in n for n in res.approximations)
    assert any("Interleaved" in n or "interleaved" in n for n in res.approximations)


def test_deepspeed_fsdp_is_zero3():
    res = render("tt2412-t3-8b-fsdp-128g", "deepspeed")
    cfg = heredoc_json(res.text)
    assert cfg["zero_optimization"]["stage"] == 3 and cfg["gradient_accumulation_steps"] == 1
    assert "activation_checkpointing" in cfg
    assert "--no-pipeline-parallel" in bash_array(res.text, "MDS_ARGS")
    # The plan was predicted for torchtitan: its per-op recompute policy and its stack are both said.
    assert len(res.approximations) == 2 and any("predicted for the torchtitan stack" in n for n in res.approximations)
    assert any("policy op" in n for n in res.approximations)


# ---------------------------------------------------------------- CLI
def test_cli_exit_codes_and_stderr(tmp_path, capsys):
    plan = str(GOLDEN / "plans" / "dgxc-grok-1-314b-bf16-1024g.toml")
    out = tmp_path / "grok.sh"
    assert run_export(plan, to="megatron", out=str(out)) == APPROXIMATE_EXIT
    assert "GeGLU" in capsys.readouterr().err and "GeGLU" in out.read_text()
    assert run_export(plan, to="megatron", out=str(out), allow_approximate=True) == 0
    assert run_export(str(GOLDEN / "plans" / "dgxc-gpt-3-175b-bf16-256g.toml"), to="megatron") == 0
    assert "--num-layers-per-virtual-pipeline-stage 1" in capsys.readouterr().out


def test_cli_model_override(capsys):
    plan = str(GOLDEN / "plans" / "tt2412-t3-8b-fsdp-128g.toml")
    assert run_export(plan, to="torchtitan", model_ref="llama3-70b", allow_approximate=True) == 0
    assert 'flavor = "70B"' in capsys.readouterr().out


# ---------------------------------------------------------------- golden files
@pytest.mark.parametrize("name", PLANS)
@pytest.mark.parametrize("to,fmt", OUTPUTS)
def test_golden_exports(name, to, fmt):
    exp = get_exporter(to)
    path = GOLDEN / "exports" / f"{name}.{to}{exp.suffix(fmt)}"
    if refused(load(name)[1], to):
        with pytest.raises(ExportError):
            render(name, to, fmt)
        assert not path.exists()
        return
    text = render(name, to, fmt).text
    if os.environ.get("MESHPLAN_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.read_text() == text, f"{path.name} changed; rerun with MESHPLAN_UPDATE_GOLDEN=1 if intended"


def test_uneven_batch_shares_are_an_approximation_everywhere(tmp_path, capsys):
    from meshplan.cli.export import run_export
    from meshplan.spec.plan import Plan
    from meshplan.spec.plan_file import plan_file_text

    plan = Plan(global_batch=24, seq_len=2048, micro_batch=1, dp=16, rank_order="tp-cp-ep-pp-dp",
                batch_shares=(1, 2))
    path = tmp_path / "shares.toml"
    path.write_text(plan_file_text(plan, model="llama3-8b", gpus="8xa100-80gb+8xh100-sxm"))
    for to in ("megatron", "torchtitan", "deepspeed"):
        out = tmp_path / f"out.{to}"
        assert run_export(str(path), to=to, out=str(out)) == 3
        assert "uneven data-parallel batch shares" in out.read_text()
        assert "uneven data-parallel batch shares" in capsys.readouterr().err
