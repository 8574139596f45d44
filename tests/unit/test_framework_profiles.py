"""Software-stack profiles and recipes: presets that cite their sources, resolution from the validation columns,
what a stack cannot run, and one prediction for what meshplan's runtime runs whichever command asks."""

from __future__ import annotations

import dataclasses

import pytest

from meshplan import catalog
from meshplan.errors import SpecError
from meshplan.spec.checks import stack_violations
from meshplan.spec.framework import BEHAVIOUR_FIELDS, CAPABILITY_FIELDS
from meshplan.spec.plan import Plan
from meshplan.spec.recipe import Recipe

NAMES = catalog.framework_names()


def test_the_issue_lists_every_preset():
    assert set(NAMES) >= {"megatron-lm-2021", "megatron-lm-2022", "megatron-core", "nemo", "megatron-bridge",
                          "deepspeed-2021", "megatron-deepspeed", "torchtitan", "torchtitan-compiled", "llm-foundry",
                          "fms-fsdp", "meshplan"}


@pytest.mark.parametrize("name", NAMES)
def test_every_field_of_every_preset_cites_a_source(name):
    profile = catalog.framework(name)
    assert profile.name == name and profile.summary
    missing = [f for f in BEHAVIOUR_FIELDS + CAPABILITY_FIELDS if not profile.sources.get(f)]
    assert not missing, missing


def test_plan_holds_no_stack_behaviour():
    assert not {f.name for f in dataclasses.fields(Plan)} & set(BEHAVIOUR_FIELDS)
    assert Plan(global_batch=8, seq_len=8).framework == "megatron-core"


@pytest.mark.parametrize("stack,version,want", [
    ("megatron-lm", "2021", "megatron-lm-2021"), ("megatron-lm", "2022", "megatron-lm-2022"),
    ("megatron-lm", "2024", "megatron-core"), ("megatron-core", "0.8.0", "megatron-core"), ("nemo", "24.07", "nemo"),
    ("megatron-bridge", "25.11", "megatron-bridge"), ("deepspeed", "2021", "deepspeed-2021"),
    ("deepspeed", "0.16", "megatron-deepspeed"), ("torchtitan", "2024-12", "torchtitan"),
    ("llm-foundry", "", "llm-foundry"), ("fms-fsdp", "", "fms-fsdp"), ("meta-internal", "", "megatron-core"),
    ("MosaicML llm-foundry", "", "llm-foundry"), ("IBM fms_fsdp", "", "fms-fsdp"),  # the first name within
    ("Megatron-DeepSpeed", "", "megatron-deepspeed"), ("NVIDIA NeMo", "", "nemo"),
    ("NeMo/Megatron-Core", "", "nemo"), ("Megatron-Bridge / Megatron-Core", "", "megatron-bridge"),
    ("torchtitan (FSDP2)", "", "torchtitan"), ("verl + Megatron-Core", "", "megatron-core"),
])
def test_profile_from_the_framework_columns(stack, version, want):
    profile, note = catalog.framework_for(stack, version)
    assert profile.name == want
    assert ("no profile" in note) == (stack == "meta-internal")


def test_settings_change_behaviour_not_capabilities():
    mc = catalog.framework("megatron-core")
    half = mc.with_(grad_dtype="bf16", optimizer_dtype="bf16")
    assert half.changes_from(mc) == {"grad_dtype": "bf16", "optimizer_dtype": "bf16"}
    with pytest.raises(SpecError, match="can set only"):
        mc.with_(schedules=("zbv",))
    with pytest.raises(SpecError, match="cannot overlap TP communication"):
        catalog.framework("megatron-deepspeed").with_(tp_comm_overlap=True)
    with pytest.raises(SpecError, match="did you mean: megatron-core"):
        catalog.framework("megatron-cor")


def test_what_a_stack_cannot_run_is_said():
    assert stack_violations(Plan(global_batch=16, seq_len=1024, pp=2, vpp=2, dp=4, schedule="zbv"),
                            catalog.framework("megatron-core")) == [
        "schedule zbv: megatron-core runs the pipeline schedules 1f1b, interleaved_1f1b"]
    assert stack_violations(Plan(global_batch=16, seq_len=1024, tp=2, dp=4), catalog.framework("llm-foundry")) == [
        "tp=2: llm-foundry has no tensor parallelism (use tp=1 or another framework)"]
    assert "ZeRO stage <= 1" in stack_violations(Plan(global_batch=16, seq_len=1024, pp=2, dp=4, zero=2),
                                                 catalog.framework("megatron-deepspeed"))[0]
    assert stack_violations(Plan(global_batch=16, seq_len=1024, dp=8, zero=1),
                            catalog.framework("megatron-lm-2021")) == [
        "zero=1: megatron-lm-2021 has no ZeRO/FSDP sharding (use zero=0)"]


def test_the_search_stays_inside_the_stack():
    from meshplan.search import SearchRequest, search

    model, cluster = catalog.model("llama3-8b"), catalog.cluster("16xh100-sxm")
    res = search(model, cluster, SearchRequest(global_batch=64, seq_len=4096, framework=catalog.framework("fms-fsdp"),
                                               simulate=False, top=3))
    assert res.plans and all(rp.plan.tp == rp.plan.pp == 1 and rp.plan.framework == "fms-fsdp" for rp in res.plans)
    assert all(rp.plan.recompute in ("none", "full") for rp in res.plans)


def test_meshplan_plan_and_check_predict_the_same_step():
    # `meshplan plan --framework meshplan` on the local CPUs and `meshplan check`'s prediction of that same plan,
    # under the runtime's profile, are one estimate.
    from meshplan.calibrate.agreement import CheckSpace
    from meshplan.cli.check import predict_all
    from meshplan.search import SearchRequest, search

    res = search(catalog.model("tiny-llama"), catalog.cluster("2xcpu"),
                 SearchRequest(global_batch=8, seq_len=64, precision="fp32", framework=catalog.framework("meshplan"),
                               top=1))
    win = res.best
    (t, _), = predict_all("tiny-llama", "cpu", [win.plan], 2, CheckSpace(world=2, global_batch=8, seq_len=64).stack)
    assert win.plan.framework == "meshplan" and t == pytest.approx(win.estimate.step_time, rel=1e-12)


def test_recipes_are_data_with_sources():
    recipes = catalog.recipes()
    assert recipes and all(r.source and r.sets for r in recipes)
    with pytest.raises(SpecError, match="did you mean: framework"):
        Recipe(name="bad", source="x", match={"frameworks": "nemo"}, sets={"grad_dtype": "bf16"})
    with pytest.raises(SpecError, match="must be one of ceil_rest_last"):
        Recipe(name="bad", source="x", match={}, sets={"layer_split": "zigzag"})


def test_recipe_matching_reads_columns_and_the_sources_own_notes():
    r = next(x for x in catalog.recipes() if x.name == "megatron-bridge-deepseek-v3-b200-recompute")
    facts = {"stack": "megatron-bridge", "framework": "megatron-bridge", "framework_version": "25.11", "source": "",
             "model": "deepseekv3", "gpu": "b200", "pp": 16, "vpp": 1, "ep": 8, "precision": "fp8", "recompute": "",
             "text": ""}
    assert r.matches(facts)
    assert not r.matches({**facts, "recompute": "full"})  # the run's own recompute column wins
    compile_recipe = next(x for x in catalog.recipes() if x.name == "torchtitan-compile")
    assert compile_recipe.matches({**facts, "stack": "torchtitan", "text": "tt-8b-compile-8g"})
    assert not compile_recipe.matches({**facts, "stack": "torchtitan", "text": "tt-8b-8g"})


@pytest.mark.parametrize(("run_id", "profile", "fp8_gather"), [
    ("ttperf-405b-fp8", "torchtitan-compiled", True),  # the 405B preset committed with the numbers (9515a140b)
    ("ttperf-405b-bf16", "torchtitan", False),  # the same table's "Optimizations: None" row
    ("tttrainy-h200-8b-32g", "torchtitan-compiled", True),  # the benchmark's own torchrun command
    ("tt2412-t5-405b-1f1b-512g", "torchtitan-compiled", True),  # 9dec370's 405B preset
    ("tt2412-t1-8b-fsdp-8g", "torchtitan", False),  # Table 1's eager, 16-bit row
])
def test_torchtitan_runs_get_the_configuration_their_source_publishes(run_id, profile, fp8_gather, runs_csv):
    """A switching recipe (the source says compile) still applies the rest of what it sets (the float8 FSDP
    all-gather of the same preset or command)."""
    import csv

    from meshplan.calibrate.runs import row_to_run

    with open(runs_csv, newline="") as f:
        row = next(r for r in csv.DictReader(f) if r["id"] == run_id)
    run = row_to_run(row)
    assert (run.framework.name, run.framework.fp8_fsdp_gather) == (profile, fp8_gather)



@pytest.mark.parametrize("zero, notes, tp, dp, want", [
    (3, "FSDP; HSDP shard group within the node", 1, 128, 8),  # the dataset's HSDP convention: a node's dp ranks
    (3, "Hybrid sharding: sharded within the node, replicated across nodes", 2, 64, 4),  # tp 2 leaves 4 per node
    (3, "FSDP full shard", 1, 128, 0),  # plain FSDP shards over all of dp
    (1, "HSDP", 1, 128, 0),  # only a fully sharded row can be hybrid
    (3, "HSDP", 1, 4, 0),  # a node holds all of dp: that is plain FSDP
])
def test_hsdp_rows_shard_within_the_node(zero, notes, tp, dp, want):
    from meshplan.calibrate.runs import row_plan

    row = {"global_batch": str(2 * dp), "seq_len": "4096", "tp": str(tp), "pp": "1", "dp": str(dp), "cp": "1",
           "zero": str(zero), "gpus_per_node": "8", "notes": notes, "precision": "bf16"}
    assert row_plan(row, catalog.framework("fms-fsdp")).dp_shard == want


@pytest.mark.parametrize("vpp, rid, notes, want", [
    ("", "x-405b-interleaved1f1b", "", 2),  # named interleaved: at least two virtual stages
    ("", "meta-405b-16k", "interleaved 1F1B with a tuned number of micro-batches", 2),  # said so in the notes
    ("", "mcore-119b", "Micro-batch, recompute, ffn size, interleaving and interconnect not stated", 1),  # unknown
    ("", "x", "not interleaved", 1),
    ("4", "x", "interleaved", 4),  # a published depth wins
])
def test_virtual_stages_from_the_row(vpp, rid, notes, want):
    from meshplan.calibrate.runs import row_plan

    row = {"id": rid, "model": "", "global_batch": "256", "seq_len": "4096", "tp": "8", "pp": "8", "dp": "8",
           "vpp": vpp, "notes": notes, "gpus_per_node": "8"}
    assert row_plan(row, catalog.framework("megatron-core")).vpp == want


@pytest.mark.parametrize("stack, recompute, want", [
    ("fms-fsdp", "selective", "full"),  # fms-fsdp's selective_checkpointing wraps whole blocks
    ("llm-foundry", "selective", "full"),  # Composer's activation_checkpointing_target: whole modules
    ("megatron-core", "selective", "selective"),  # a stack with a selective mode keeps it
    ("fms-fsdp", "none", "none"),
])
def test_selective_on_a_stack_without_it_is_whole_block_checkpointing(runs_csv, stack, recompute, want):
    """A published run on fms-fsdp or Composer that says "selective" is predicted (as full recompute, noted), not
    skipped: those stacks' own selective checkpointing recomputes whole blocks."""
    import csv

    from meshplan.calibrate.runs import row_to_run

    with open(runs_csv, newline="") as f:
        row = next(r for r in csv.DictReader(f) if r["id"] == "tt2412-t1-8b-fsdp-8g")
    run = row_to_run({**row, "framework": stack, "framework_version": "", "recompute": recompute})
    assert run.plan.recompute == want
    assert ("read as full" in run.profile_note) == (want != recompute)


@pytest.mark.parametrize("text, mode", [
    ("full", "full"), ("Full (uniform)", "full"), ("block", "full"), ("True", "full"), ("selective", "selective"),
    ("Selective (core attention)", "selective"), ("none", "none"), ("off", "none"), ("", ""),
])
def test_recompute_spellings(text, mode):
    from meshplan.spec.plan import recompute_name

    assert recompute_name(text) == mode


@pytest.mark.parametrize("text, stage", [("1", 1), ("ZeRO-1", 1), ("zero3", 3), ("3 (FSDP)", 3),
                                         ("1 (distributed optimizer)", 1), ("", 0)])
def test_zero_stage_spellings(text, stage):
    from meshplan.calibrate.run_cells import zero_stage

    assert zero_stage({"zero": text}) == stage


@pytest.mark.parametrize("text, on", [("yes", 1), ("True", 1), ("1", 1), ("no", 0), ("0", 0), ("", 0)])
def test_flag_spellings(text, on):
    from meshplan.calibrate.run_cells import flag

    assert flag({"sp": text}, "sp") == on


@pytest.mark.parametrize("text, name", [("bf16-mixed", "bf16"), ("amp_bf16", "bf16"), ("amp_fp8", "fp8"),
                                        ("fp8-hybrid", "fp8"), ("FP8-CS", "fp8"), ("MXFP8", "fp8"),
                                        ("mixed bf16", "bf16"), ("NVFP4", "nvfp4")])
def test_precision_recipe_spellings(text, name):
    from meshplan.spec.plan import precision_name

    assert precision_name(text) == name


def test_a_stack_with_one_kind_of_context_parallelism_runs_it(runs_csv):
    """megatron-deepspeed's CP is DeepSpeed-Ulysses (all-to-all): its cp > 1 rows are read as that, not refused."""
    import csv

    from meshplan.calibrate.runs import row_to_run

    with open(runs_csv, newline="") as f:
        row = next(r for r in csv.DictReader(f) if r["id"] == "tt2412-t1-8b-fsdp-8g")
    ulysses = {**row, "framework": "megatron-deepspeed", "framework_version": "", "seq_len": "32768",
               "global_batch": "4", "micro_batch": "1", "dp": "4", "cp": "2", "zero": "1", "recompute": "full"}
    assert row_to_run(ulysses).plan.cp_kind == "a2a"


def test_a_release_written_with_a_v_takes_its_preset():
    assert catalog.framework_for("deepspeed", "v0.5.0")[0].name == "deepspeed-2021"
    assert catalog.framework_for("megatron-lm", "v2")[0].name == "megatron-lm-2021"  # a preset that lists "v2"


def test_numbers_in_the_notes_are_read_as_sources_write_them():
    from meshplan.calibrate.run_cells import note_int

    assert note_int("Qwen3 head_dim=128", r"head_dim\s*[=:]?\s*(\d+)") == 128
    assert note_int("DeepSeek-V2-Lite: q_lora 0 (no query compression)", r"q_lora\s*[=:]?\s*(\d+)", 1536) == 0
    assert note_int("no rank stated", r"q_lora\s*[=:]?\s*(\d+)", 1536) == 1536
    assert note_int("first 1 layer dense", r"first (\d+) layers? dense") == 1
