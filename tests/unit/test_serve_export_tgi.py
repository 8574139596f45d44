"""TGI and LMDeploy exports: the values in the exported commands, the refusals, the commands fed to parsers built
from the engines' own option definitions (``tests/golden/serve/{tgi,lmdeploy}_reference.toml``, read from their
sources: neither parser installs here), and golden files (``MESHPLAN_UPDATE_GOLDEN=1`` rewrites them)."""

from __future__ import annotations

import argparse
import os
import tomllib
from pathlib import Path

import pytest
from test_serve_export import servers  # the script reader the other serving-export tests use

from meshplan import catalog
from meshplan.export.base import ExportError
from meshplan.export.serve import export_serving
from meshplan.spec.serving import ServePlan, Workload

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "serve"
REF = "meta-llama/Llama-3.1-70B-Instruct"
W = Workload(input_len=1024, output_len=256, concurrency=64)
CASES = {  # name -> (model, plan, engine profile); the first two are golden files
    "llama3.1-70b-fp8-2xtp4-tgi": ("llama3.1-70b", ServePlan(tp=4, replicas=2, precision="fp8", kv_dtype="fp8",
                                                             engine="tgi"), "tgi"),
    "llama3.1-70b-tp4-lmdeploy": ("llama3.1-70b", ServePlan(tp=4, engine="lmdeploy"), "lmdeploy"),
    "tgi2-tp8": ("llama3.1-70b", ServePlan(tp=8, engine="tgi-2"), "tgi-2"),
    "lmdeploy-fp8kv-2xtp2": ("llama3.1-70b", ServePlan(tp=2, replicas=2, precision="fp8", kv_dtype="fp8",
                                                       engine="lmdeploy"), "lmdeploy"),
}
PROGRAM = {"tgi": ("text-generation-launcher", "launcher", "3.3.7"), "tgi-2": ("text-generation-launcher",
           "launcher", "2.4.1"), "lmdeploy": ("lmdeploy", "api_server", "0.16.0")}


def _export(name: str, **kw):
    model, plan, engine = CASES[name]
    args = dict(model=catalog.model(model), model_ref=REF, plan=plan, engine=catalog.engine(engine), work=W)
    return export_serving(**{**args, **kw})


def _parser(engine: str) -> argparse.ArgumentParser:
    """A parser of the options the reference lists for the engine's release; unknown flags and bad values fail."""
    _, section, version = PROGRAM[engine]
    name = "tgi" if engine.startswith("tgi") else "lmdeploy"
    ref = tomllib.loads((GOLDEN / f"{name}_reference.toml").read_text())[section][version]
    p = argparse.ArgumentParser(exit_on_error=False)
    if "positional" in ref:
        p.add_argument(ref["positional"])
    kinds = {"int": int, "float": float, "str": str, "int_list": lambda v: [int(x) for x in v.split(",")]}
    for o in ref["options"]:
        if o["type"] == "choice":
            p.add_argument(*o["names"], choices=o["choices"])
        else:
            p.add_argument(*o["names"], type=kinds[o["type"]])
    return p


def _parsed(engine: str, argv: list[str]) -> argparse.Namespace:
    program = PROGRAM[engine][0]
    rest = argv[1:] if program == "text-generation-launcher" else argv[3:]  # lmdeploy serve api_server MODEL ...
    ns, unknown = _parser(engine).parse_known_args(rest)
    assert not unknown, f"{engine} does not accept {unknown}"
    return ns


@pytest.mark.parametrize("name", list(CASES))
def test_every_command_parses_and_carries_the_plan(name):
    model, plan, engine = CASES[name]
    done = _export(name)
    launches = servers(done.files["launch.sh"], PROGRAM[engine][0])
    assert len(launches) == plan.replicas
    prof = catalog.engine(engine)
    for i, (env, argv) in enumerate(launches):
        ns = _parsed(engine, argv)
        assert len(env["CUDA_VISIBLE_DEVICES"].split(",")) == plan.tp
        if engine.startswith("tgi"):
            # the router refuses requests beyond --max-concurrent-requests: raised to the benchmark's 640
            assert (ns.model_id, ns.num_shard, ns.max_concurrent_requests) == (REF, plan.tp, 640)
            # every size the prediction pads a decode batch to is captured
            assert {prof.graph_batch(b) for b in range(1, 33)} <= set(ns.cuda_graphs) and ns.cuda_graphs[-1] == 32
            assert ns.max_total_tokens == 2048  # 1280, rounded up to 1024s
            # --dtype or --quantize, never both (text_generation_server/cli.py refuses the pair)
            assert (ns.dtype is None) is (ns.quantize is not None)
            assert (ns.quantize == "fp8") is (plan.precision == "fp8")
            assert (ns.kv_cache_dtype == "fp8_e4m3fn") is (plan.kv_dtype == "fp8")
            # replicas on one node: their own shard socket and NCCL rendezvous
            assert (ns.master_port, ns.shard_uds_path) == ((29500 + i, f"/tmp/text-generation-server-{i}") if i else
                                                           (None, None))
        else:
            assert (ns.model_path, ns.tp, ns.backend, ns.max_batch_size) == (REF, plan.tp, "turbomind",
                                                                               prof.max_num_seqs)
            assert (ns.cache_max_entry_count, ns.cache_block_seq_len, ns.max_prefill_token_num) == (0.8, 64, 8192)
            assert (ns.quant_policy == "8") is (plan.kv_dtype == "fp8")
    assert "vllm bench serve" in done.files["bench.sh"].replace(" \\\n", " ")


def test_tgi_3_writes_its_compute_optimal_prefill_budget():
    """The prefill budget in the launch is the one the prediction ran with (TGI 3's own default for the layout:
    4 H100 x 900 TFLOPs over Llama-3.1-70B's FLOPs per token), not a guess."""
    from meshplan.cost.serve_sizing import sized_engine

    model, plan = catalog.model("llama3.1-70b"), ServePlan(tp=4, engine="tgi")
    e = sized_engine(catalog.engine("tgi"), model, plan, catalog.cluster("4xh100-sxm").pools[0], W)
    done = export_serving(model=model, model_ref=REF, plan=plan, engine=e, work=W)
    [(_, argv)] = servers(done.files["launch.sh"], "text-generation-launcher")
    assert _parsed("tgi", argv).max_batch_prefill_tokens == e.max_batched_tokens == 24383


def test_what_the_engines_cannot_start_is_refused():
    """The pipeline and disaggregation refusals come from the profiles' ``max_pp`` / ``disaggregation`` fields and
    quote the source each profile cites for them."""
    for engine, source in (("tgi", "launcher/src/main.rs"), ("lmdeploy", "TurbomindEngineConfig")):
        args = dict(model=catalog.model("llama3.1-70b"), model_ref=REF, engine=catalog.engine(engine), work=W)
        with pytest.raises(ExportError, match=f"no pipeline parallelism beyond 1 stage.*{source}"):
            export_serving(plan=ServePlan(tp=4, pp=2, engine=engine), **args)
        with pytest.raises(ExportError, match="no disaggregated mode: .*dynamo@416ff06e"):
            export_serving(plan=ServePlan(tp=4, engine=engine), disagg={
                "prefill": ServePlan(tp=4, engine=engine), "decode": ServePlan(tp=4, engine=engine),
                "prefill_replicas": 1, "decode_replicas": 1}, **args)
        with pytest.raises(ExportError, match="spans nodes"):
            export_serving(plan=ServePlan(tp=16, engine=engine), **args)
    # TGI 2 without prefill chunking: a prompt longer than the prefill budget cannot be admitted
    with pytest.raises(ExportError, match="max_batch_prefill_tokens"):
        export_serving(model=catalog.model("llama3.1-70b"), model_ref=REF, plan=ServePlan(tp=8, engine="tgi-2"),
                       engine=catalog.engine("tgi-2"), work=Workload(input_len=6000, output_len=100))


def test_a_lowered_running_cap_is_max_batch_size_on_tgi_2_and_said_on_tgi_3():
    """The search's lower caps: TGI 2's router honours --max-batch-size; TGI 3 ignores it under prefill chunking
    (backends/v3/src/backend.rs), so its export says so."""
    from dataclasses import replace

    for engine, flag in (("tgi-2", True), ("tgi", False)):
        e = replace(catalog.engine(engine), max_num_seqs=32)
        done = export_serving(model=catalog.model("llama3.1-70b"), model_ref=REF, plan=ServePlan(tp=8, engine=engine),
                              engine=e, work=W)
        [(_, argv)] = servers(done.files["launch.sh"], "text-generation-launcher")
        assert (_parsed(engine, argv).max_batch_size == 32) is flag
        assert any("--max-batch-size" in a for a in done.approximations) is not flag


def test_lmdeploy_says_what_turbomind_cannot_do():
    done = _export("lmdeploy-fp8kv-2xtp2")
    assert any("int8 KV" in a for a in done.approximations) and not done.exact
    assert any("FP8 checkpoint" in a for a in done.approximations)
    assert _export("llama3.1-70b-tp4-lmdeploy").exact


def test_the_reference_parsers_refuse_what_the_sources_do_not_have():
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        _parser("tgi").parse_args(["--quantize", "nvfp4"])
    assert _parser("tgi").parse_known_args(["--max-num-seqs", "8"])[1] == ["--max-num-seqs", "8"]
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        _parser("lmdeploy").parse_args(["m", "--backend", "vllm"])


@pytest.mark.parametrize("name", list(CASES)[:2])
def test_golden_files(name):
    folder = GOLDEN / name
    files = _export(name).files
    if os.environ.get("MESHPLAN_UPDATE_GOLDEN"):
        folder.mkdir(parents=True, exist_ok=True)
        for fname, text in files.items():
            (folder / fname).write_text(text)
    assert sorted(p.name for p in folder.iterdir()) == sorted(files)
    for fname, text in files.items():
        assert (folder / fname).read_text() == text, f"{name}/{fname} changed; MESHPLAN_UPDATE_GOLDEN=1 rewrites it"


def test_the_refusals_follow_the_profile_fields_not_the_engine_family():
    """A vLLM profile that declares one pipeline stage and no disaggregation is refused both, like TGI."""
    import dataclasses

    vllm = catalog.engine("vllm")
    one = dataclasses.replace(vllm, max_pp=1, disaggregation=False, sources={**vllm.sources, "max_pp": "test: one",
                                                                             "disaggregation": "test: none"})
    args = dict(model=catalog.model("llama3.1-70b"), model_ref=REF, engine=one, work=W)
    with pytest.raises(ExportError, match="pp=2: engine profile vllm has no pipeline parallelism .*test: one"):
        export_serving(plan=ServePlan(tp=4, pp=2), **args)
    with pytest.raises(ExportError, match="test: none"):
        export_serving(plan=ServePlan(tp=4), disagg={"prefill": ServePlan(tp=4), "decode": ServePlan(tp=4),
                                                     "prefill_replicas": 1, "decode_replicas": 1}, **args)
    assert "launch.sh" in export_serving(plan=ServePlan(tp=4, pp=2), **{**args, "engine": vllm}).files
