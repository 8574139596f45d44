"""Serving exports (meshplan.export.serve): the values in the exported commands, refusals and approximations, the
exports fed to the engines' own argument parsers, and golden files.

Parsers: vLLM 0.6.0 and 0.11.0 (``vllm serve`` / ``vllm bench serve`` as vllm/scripts.py and
vllm/entrypoints/cli/main.py build them) and SGLang 0.3.0 and 0.5.23 (``ServerArgs.add_cli_args`` +
``ServerArgs.from_cli_args``; ``sglang.bench_serving``'s parser), each from its wheel in
``.venv/serveparsers/<pkg>-<version>`` (``make`` installs them, without dependencies; see the Makefile's
``.extras``), run in a subprocess with that folder on PYTHONPATH; tests skip when one is missing. TensorRT-LLM's
wheel cannot be installed here: its flags and LLM-API keys, read from its source, are in
``tests/golden/serve/trtllm_reference.toml`` and become a click command and pydantic models that refuse unknown keys.
Golden files: ``MESHPLAN_UPDATE_GOLDEN=1`` rewrites ``tests/golden/serve/<case>/``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Literal, Optional

import pytest

from meshplan import catalog
from meshplan.export.base import ExportError
from meshplan.export.serve import export_serving
from meshplan.export.serve_common import context_len, make_job, num_prompts, placements
from meshplan.export.serve_trtllm import graph_sizes
from meshplan.spec.serving import ServePlan, Workload
from meshplan.spec.speculation import Speculation

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "serve"
PARSERS = Path(sys.prefix) / "serveparsers"
REF = "meta-llama/Llama-3.1-70B-Instruct"
W_CLOSED = Workload(input_len=1024, output_len=256, concurrency=64)
W_OPEN = Workload(input_len=2048, output_len=512, rate=4.0)
W_OFFLINE = Workload(input_len=1024, output_len=1024)


def _disagg(engine: str, p_tp: int, p_n: int, d_tp: int, d_n: int) -> dict:
    return {"prefill": ServePlan(tp=p_tp, engine=engine), "decode": ServePlan(tp=d_tp, engine=engine),
            "prefill_replicas": p_n, "decode_replicas": d_n}


# name -> (model, model_ref, plan, engine profile, workload, disagg); the first four are the golden files
CASES = {
    "llama3.1-70b-tp8-vllm": ("llama3.1-70b", REF, ServePlan(tp=8), "vllm", W_CLOSED, None),
    "llama3.1-70b-2xtp4-sglang": ("llama3.1-70b", REF, ServePlan(tp=4, replicas=2, engine="sglang"), "sglang",
                                  W_OPEN, None),
    "llama3.1-70b-fp8-tp4-trtllm": ("llama3.1-70b", "nvidia/Llama-3.1-70B-Instruct-FP8",
                                    ServePlan(tp=4, precision="fp8", kv_dtype="fp8", engine="trtllm"), "trtllm",
                                    W_OFFLINE, None),
    "llama3.1-70b-disagg-sglang": ("llama3.1-70b", REF, ServePlan(tp=4, engine="sglang"), "sglang",
                                   Workload(input_len=4096, output_len=256, concurrency=32),
                                   _disagg("sglang", 2, 2, 4, 1)),
    "vllm060-2xtp2": ("llama3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", ServePlan(tp=2, replicas=2), "vllm-0.6.0",
                      W_OPEN, None),
    "vllm060-fp8-closed": ("llama3.1-70b", REF, ServePlan(tp=4, precision="fp8", kv_dtype="fp8"), "vllm-0.6.0",
                           W_CLOSED, None),
    "vllm-2xtp4-dp": ("llama3.1-70b", REF, ServePlan(tp=4, replicas=2), "vllm", W_OFFLINE, None),
    "vllm-4xtp4-2nodes": ("llama3.1-70b", REF, ServePlan(tp=4, replicas=4, kv_dtype="fp8"), "vllm", W_CLOSED, None),
    "vllm-mixtral-ep": ("mixtral-8x7b", "mistralai/Mixtral-8x7B-Instruct-v0.1", ServePlan(tp=4, ep=4), "vllm",
                        W_OPEN, None),
    "vllm-disagg": ("llama3.1-70b", REF, ServePlan(tp=4), "vllm", W_CLOSED, _disagg("vllm", 4, 1, 4, 1)),
    "sglang030-2xtp4": ("llama3.1-70b", REF, ServePlan(tp=4, replicas=2, kv_dtype="fp8", engine="sglang-0.3.0"),
                        "sglang-0.3.0", W_OPEN, None),
    "sglang030-closed": ("llama3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", ServePlan(tp=1), "sglang-0.3.0",
                         W_CLOSED, None),
    "sglang-tp8pp2-2nodes": ("llama3.1-405b", "meta-llama/Llama-3.1-405B-Instruct",
                             ServePlan(tp=8, pp=2, precision="fp8", kv_dtype="fp8"), "sglang", W_CLOSED, None),
    "sglang-mixtral-ep": ("mixtral-8x7b", "mistralai/Mixtral-8x7B-Instruct-v0.1", ServePlan(tp=4, ep=2), "sglang",
                          W_OFFLINE, None),
    "trtllm-2xtp4": ("llama3.1-70b", REF, ServePlan(tp=4, replicas=2), "trtllm", W_CLOSED, None),
    "trtllm-mixtral-ep": ("mixtral-8x7b", "mistralai/Mixtral-8x7B-Instruct-v0.1", ServePlan(tp=4, ep=4), "trtllm",
                          W_OPEN, None),
    "trtllm-disagg": ("llama3.1-70b", REF, ServePlan(tp=4), "trtllm", W_CLOSED, _disagg("trtllm", 2, 2, 4, 1)),
    "trtllm017-tp4": ("llama3.1-70b", REF, ServePlan(tp=4), "trtllm-0.17", W_OFFLINE, None),
    "vllm-deepseek-adp8": ("deepseek-v3", "deepseek-ai/DeepSeek-V3", ServePlan(tp=1, attn_dp=8, ep=8,
                           precision="fp8"), "vllm", W_CLOSED, None),
    "sglang-deepseek-tp2adp4": ("deepseek-v3", "deepseek-ai/DeepSeek-V3", ServePlan(tp=2, attn_dp=4, ep=8,
                                precision="fp8", engine="sglang"), "sglang", W_CLOSED, None),
    "trtllm-deepseek-adp8": ("deepseek-v3", "deepseek-ai/DeepSeek-V3", ServePlan(tp=1, attn_dp=8, ep=8,
                             precision="fp8", engine="trtllm"), "trtllm", W_CLOSED, None),
}
EAGLE3_8B = Speculation(method="eagle", draft_tokens=3, acceptance=0.7,
                       checkpoint="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")
EAGLE3_70B = Speculation(method="eagle", draft_tokens=4, acceptance=0.7,
                         checkpoint="yuhuili/EAGLE3-LLaMA3.3-Instruct-70B")
MTP = Speculation(method="mtp", draft_tokens=2, acceptance=0.85)
DRAFT_1B = Speculation(method="draft", draft_tokens=5, acceptance=0.6, draft=catalog.model("llama3.2-1b"),
                       checkpoint="meta-llama/Llama-3.2-1B-Instruct")
NGRAM = Speculation(method="ngram", draft_tokens=3, acceptance=0.3)
CASES |= {  # speculative decoding, one drafter per engine
    "vllm-eagle3": ("llama3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", ServePlan(tp=1, speculation=EAGLE3_8B), "vllm",
                    W_CLOSED, None),
    "vllm-deepseek-mtp": ("deepseek-v3", "deepseek-ai/DeepSeek-V3", ServePlan(tp=8, precision="fp8", speculation=MTP),
                          "vllm", W_CLOSED, None),
    "sglang-deepseek-mtp": ("deepseek-v3", "deepseek-ai/DeepSeek-V3", ServePlan(tp=8, precision="fp8",
                            engine="sglang", speculation=MTP), "sglang", W_CLOSED, None),
    "sglang-draft": ("llama3.1-70b", REF, ServePlan(tp=4, engine="sglang", speculation=DRAFT_1B), "sglang", W_OPEN,
                     None),
    "trtllm-eagle3": ("llama3.1-70b", REF, ServePlan(tp=4, engine="trtllm", speculation=EAGLE3_70B), "trtllm",
                      W_CLOSED, None),
    "trtllm-ngram": ("llama3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", ServePlan(tp=1, engine="trtllm",
                     speculation=NGRAM), "trtllm", W_OFFLINE, None),
}
GOLDEN_CASES = list(CASES)[:4]


def case(name: str):
    model, ref, plan, engine, work, disagg = CASES[name]
    return dict(model=catalog.model(model), model_ref=ref, plan=plan, engine=catalog.engine(engine), work=work,
                disagg=disagg)


@pytest.fixture(scope="module")
def exports() -> dict:
    return {name: export_serving(**case(name)) for name in CASES}


def commands(text: str) -> list[tuple[dict[str, str], list[str]]]:
    """(environment, argv) of every command in a script: continuation lines joined, comments and ``wait`` dropped,
    leading VAR=value words taken as the environment, a trailing ``&`` dropped."""
    out, logical = [], ""
    for line in text.splitlines():
        if line.startswith("#") and not logical:
            continue
        logical += line[:-1] + " " if line.endswith("\\") else line
        if line.endswith("\\"):
            continue
        words, logical = shlex.split(logical), ""
        if not words or words == ["wait"] or words[:2] == ["set", "-euo"]:
            continue
        env = {}
        while "=" in words[0] and not words[0].startswith("-"):
            k, _, v = words.pop(0).partition("=")
            env[k] = v
        out.append((env, [w for w in words if w != "&"]))
    return out


def opt(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def servers(text: str, program: str) -> list[tuple[dict, list[str]]]:
    """Commands running ``program`` (argv from the program on, an mpirun prefix dropped)."""
    return [(env, argv[argv.index(program):]) for env, argv in commands(text) if program in argv]


# ---------------------------------------------------------------- values in the exports
def test_vllm_tp8_values(exports):
    e, job = catalog.engine("vllm"), make_job(**case("llama3.1-70b-tp8-vllm"))
    [(env, argv)] = servers(exports["llama3.1-70b-tp8-vllm"].files["launch.sh"], "vllm")
    assert argv[:3] == ["vllm", "serve", REF] and env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    assert (opt(argv, "--tensor-parallel-size"), opt(argv, "--pipeline-parallel-size")) == ("8", "1")
    assert opt(argv, "--max-model-len") == "2048" == str(context_len(job))  # 1024 + 256 rounded up to 1024s
    assert float(opt(argv, "--gpu-memory-utilization")) == e.kv_memory_fraction == 0.9
    assert (opt(argv, "--max-num-seqs"), opt(argv, "--max-num-batched-tokens")) == ("1024", "8192")
    assert opt(argv, "--cuda-graph-sizes") == "512" and "--quantization" not in argv
    [(_, bench)] = commands(exports["llama3.1-70b-tp8-vllm"].files["bench.sh"])
    assert bench[:3] == ["vllm", "bench", "serve"] and opt(bench, "--max-concurrency") == "64"
    assert (opt(bench, "--num-prompts"), opt(bench, "--random-input-len"), opt(bench, "--random-output-len")) == (
        "640", "1024", "256")
    assert "--ignore-eos" in bench and exports["llama3.1-70b-tp8-vllm"].exact


def test_replicas_use_the_data_parallel_flag_on_one_node_else_ports_and_a_router(exports):
    [(env, argv)] = servers(exports["vllm-2xtp4-dp"].files["launch.sh"], "vllm")
    assert opt(argv, "--data-parallel-size") == "2" and env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    text = exports["vllm-4xtp4-2nodes"].files["launch.sh"]
    cmds = servers(text, "vllm")
    assert [opt(a, "--port") for _, a in cmds] == ["8001", "8002", "8003", "8004"]
    assert [e["CUDA_VISIBLE_DEVICES"] for e, _ in cmds] == ["0,1,2,3", "4,5,6,7"] * 2
    assert "# replica 2 (on node 1)" in text and "load balancer on port 8000" in text
    assert all(opt(a, "--kv-cache-dtype") == "fp8" for _, a in cmds)
    [(_, sgl)] = servers(exports["llama3.1-70b-2xtp4-sglang"].files["launch.sh"], "sglang.launch_server")
    assert (opt(sgl, "--dp-size"), opt(sgl, "--tp-size"), opt(sgl, "--mem-fraction-static")) == ("2", "4", "0.83")


def test_sglang_disaggregated_pools_and_router(exports):
    text = exports["llama3.1-70b-disagg-sglang"].files["launch.sh"]
    cmds = servers(text, "sglang.launch_server")
    modes = [opt(a, "--disaggregation-mode") for _, a in cmds]
    assert modes == ["prefill", "prefill", "decode"]
    assert [e["CUDA_VISIBLE_DEVICES"] for e, _ in cmds] == ["0,1", "2,3", "4,5,6,7"]
    assert [opt(a, "--disaggregation-bootstrap-port") for _, a in cmds[:2]] == ["8998", "8999"]
    [(_, router)] = servers(text, "sglang_router.launch_router")
    assert router.count("--prefill") == 2 and router.count("--decode") == 1 and opt(router, "--port") == "30000"


def test_trtllm_fp8_yaml_and_flags(exports):
    out = exports["llama3.1-70b-fp8-tp4-trtllm"]
    assert set(out.files) == {"launch.sh", "bench.sh", "extra_llm_api_options.yaml"}
    [(_, argv)] = servers(out.files["launch.sh"], "trtllm-serve")
    assert (opt(argv, "--tp_size"), opt(argv, "--backend"), opt(argv, "--max_seq_len")) == ("4", "pytorch", "2048")
    yaml = out.files["extra_llm_api_options.yaml"]
    assert "  dtype: fp8" in yaml and "  batch_sizes: [1, 2, 4, 32, 64, 96, 128]" in yaml
    assert "capacity_scheduler_policy: GUARANTEED_NO_EVICT" in yaml and "FP8-quantized checkpoint" in out.files[
        "launch.sh"]
    [(_, bench)] = commands(out.files["bench.sh"])
    assert opt(bench, "--backend") == "openai" and opt(bench, "--request-rate") == "inf"


def test_every_file_names_meshplan_and_its_target_release(exports):
    for name, out in exports.items():
        for fname, text in out.files.items():
            assert "generated by meshplan" in text.splitlines()[0] + text.splitlines()[1], (name, fname)
            assert "# target: " in text, (name, fname)


def test_layout_helpers():
    job = make_job(**{**case("vllm-2xtp4-dp"), "plan": ServePlan(tp=3, replicas=3)})
    assert placements(job)["serve"] == [(0, [0, 1, 2]), (0, [3, 4, 5]), (1, [0, 1, 2])]
    big = make_job(**case("sglang-tp8pp2-2nodes"))
    assert placements(big)["serve"] == [(0, list(range(8)))]
    assert [num_prompts(w) for w in (W_CLOSED, W_OPEN, Workload(input_len=1, output_len=1, rate=0.5), W_OFFLINE)] \
        == [640, 240, 100, 1000]
    assert graph_sizes(128, 32) == [1, 2, 4, 32, 64, 96, 128] and graph_sizes(3, 8) == [1, 2, 3]
    long = Workload(input_len=30000, output_len=2700)
    assert context_len(make_job(**{**case("vllm-mixtral-ep"), "work": long})) == 32768  # 32700 -> 32768 = trained


def test_multinode_sglang_server_is_one_command_per_node(exports):
    cmds = servers(exports["sglang-tp8pp2-2nodes"].files["launch.sh"], "sglang.launch_server")
    assert [(opt(a, "--nnodes"), opt(a, "--node-rank")) for _, a in cmds] == [("2", "0"), ("2", "1")]
    assert all(opt(a, "--kv-cache-dtype") == "fp8_e4m3" and opt(a, "--pp-size") == "2" for _, a in cmds)


# ---------------------------------------------------------------- refusals and approximations
@pytest.mark.parametrize("name,change,match", [
    ("sglang030-closed", {"plan": ServePlan(tp=2, pp=2)}, "no pipeline parallelism"),
    ("vllm060-2xtp2", {"disagg": _disagg("vllm", 2, 1, 2, 1)}, "no KV connector"),
    ("trtllm017-tp4", {"disagg": _disagg("trtllm", 2, 1, 2, 1)}, "no disaggregated mode"),
    ("sglang030-closed", {"disagg": _disagg("sglang", 1, 1, 1, 1)}, "no --disaggregation-mode"),
    ("trtllm017-tp4", {"engine": catalog.engine("nim-1.8")}, "NVIDIA NIM"),
    ("vllm-2xtp4-dp", {"work": Workload(input_len=130000, output_len=2000)}, "trained context"),
    ("vllm-2xtp4-dp", {"engine": dataclasses.replace(catalog.engine("vllm"), chunked_prefill=False,
                                                      max_batched_tokens=1024)}, "SchedulerConfig"),
    ("vllm-2xtp4-dp", {"model_ref": " "}, "empty"),
])
def test_refusals(name, change, match):
    with pytest.raises(ExportError, match=match):
        export_serving(**{**case(name), **change})


def test_meshplan_runtime_engine_has_no_serving_export():
    if "meshplan" not in catalog.engine_names():
        pytest.skip("no meshplan engine profile in this catalog")
    with pytest.raises(ExportError, match="no serving export"):
        export_serving(**{**case("vllm-2xtp4-dp"), "engine": catalog.engine("meshplan")})


def test_approximations_name_what_the_release_lacks(exports):
    assert not exports["vllm-mixtral-ep"].approximations  # --enable-expert-parallel over tp=4 = ep=4
    v060 = export_serving(**{**case("vllm060-2xtp2"), "model": catalog.model("mixtral-8x7b"),
                             "plan": ServePlan(tp=2, ep=2)})
    assert any("no --enable-expert-parallel" in a for a in v060.approximations)
    assert any("--enable-expert-parallel spreads" in a for a in export_serving(
        **{**case("vllm-mixtral-ep"), "plan": ServePlan(tp=4, ep=2)}).approximations)
    multi = export_serving(**{**case("vllm-2xtp4-dp"), "engine": dataclasses.replace(catalog.engine("vllm"),
                                                                                      multi_step=4)})
    assert any("multi_step=4" in a for a in multi.approximations) and "APPROXIMATE" in multi.files["launch.sh"]
    t017 = exports["trtllm017-tp4"].approximations
    # trtllm-bench 0.17 admits GUARANTEED_NO_EVICT, trtllm-serve's only policy: nothing to approximate there
    assert any("chunked prefill" in a for a in t017) and not any("GUARANTEED_NO_EVICT" in a for a in t017)
    lazy = export_serving(**{**case("trtllm017-tp4"), "engine": dataclasses.replace(catalog.engine("trtllm-0.17"),
                                                                                      admission="lazy")})
    assert any("GUARANTEED_NO_EVICT" in a for a in lazy.approximations)
    sgl030 = export_serving(**{**case("sglang030-closed"), "model": catalog.model("mixtral-8x7b"),
                               "plan": ServePlan(tp=2, ep=2)})
    assert any("no --ep-size" in a for a in sgl030.approximations)
    step = export_serving(**{**case("vllm060-2xtp2"), "engine": dataclasses.replace(catalog.engine("vllm-0.6.0"),
                                                                                      cuda_graph_step=16)})
    assert any("multiples of 8" in a for a in step.approximations)
    assert exports["llama3.1-70b-2xtp4-sglang"].exact and exports["trtllm-disagg"].exact


def test_old_clients_are_replaced_where_they_cannot_hold_the_load(exports):
    assert "vllm-project/vllm#9390" in exports["vllm060-2xtp2"].files["bench.sh"]
    closed = exports["sglang030-closed"].files["bench.sh"]
    assert "sgl-project/sglang#2136" in closed and "--max-concurrency 64" in closed
    assert "--max-concurrency" not in exports["sglang030-2xtp4"].files["bench.sh"]


# ---------------------------------------------------------------- golden files
@pytest.mark.parametrize("name", GOLDEN_CASES)
def test_golden_serve_exports(name, exports):
    folder = GOLDEN / name
    if os.environ.get("MESHPLAN_UPDATE_GOLDEN"):
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.iterdir():
            old.unlink()
        for fname, text in exports[name].files.items():
            (folder / fname).write_text(text)
    assert sorted(p.name for p in folder.iterdir()) == sorted(exports[name].files)
    for fname, text in exports[name].files.items():
        assert (folder / fname).read_text() == text, f"{name}/{fname} changed; rerun with MESHPLAN_UPDATE_GOLDEN=1"


# ---------------------------------------------------------------- the engines' own parsers
# tests/golden/serve/parse_vllm.py and parse_sglang.py run in a subprocess on one release's parser folder
def _side(pkg: str) -> Path:
    side = PARSERS / pkg
    if not (side / pkg.split("-")[0]).is_dir():
        pytest.skip(f"{pkg} parser not installed (make test puts it in .venv/serveparsers/{pkg})")
    return side


def _parse(pkg: str, script: str, jobs: list[dict]) -> list[dict]:
    """Run ``tests/golden/serve/<script>`` on ``jobs`` with the parser folder of ``pkg``."""
    side = _side(pkg)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join((str(side), str(GOLDEN))), VLLM_LOGGING_LEVEL="ERROR")
    if pkg.startswith("sglang"):  # nothing to download; vLLM instead resolves ids to local paths when offline
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    req = json.dumps({"version": pkg.split("-", 1)[1], "jobs": jobs})
    run = subprocess.run([sys.executable, str(GOLDEN / script)], input=req, env=env, capture_output=True, text=True,
                         timeout=600, cwd=side)
    line = [ln for ln in run.stdout.splitlines() if ln.startswith("MESHPLAN_JSON ")]
    assert run.returncode == 0 and line, run.stderr[-3000:]
    return json.loads(line[0].split(" ", 1)[1])


def _engine_of(name: str) -> str:
    return CASES[name][3]


def _jobs(exports, names, program, skip, kind="serve"):
    """(case, env, argv without the program words) of every server command of ``names``."""
    out = []
    for name in names:
        for env, argv in servers(exports[name].files["launch.sh" if kind == "serve" else "bench.sh"], program):
            out.append((name, env, argv[skip:]))
    return out


@pytest.fixture(scope="module")
def vllm_parsed(exports) -> dict:
    """Every vLLM server command parsed by its release's parser; every ``vllm bench serve`` by vLLM 0.11.0's."""
    got = {}
    for pkg, names in (("vllm-0.11.0", [n for n in CASES if _engine_of(n) == "vllm"]),
                       ("vllm-0.6.0", [n for n in CASES if _engine_of(n) == "vllm-0.6.0"])):
        serve = _jobs(exports, names, "vllm", 1)
        negative = [["serve", REF, "--data-parallel-size", "2"], ["serve", REF, "--kv-transfer-config", "{}"]]
        bench = [(n, e, a[1:]) for n in CASES for e, a in commands(exports[n].files["bench.sh"])
                 if a[:2] == ["vllm", "bench"]] if pkg == "vllm-0.11.0" else []
        jobs = [{"kind": "x", "argv": a} for _, _, a in serve + bench] + [{"kind": "x", "argv": a} for a in negative]
        try:
            res = _parse(pkg, "parse_vllm.py", jobs)
        except pytest.skip.Exception as skipped:
            got[pkg] = skipped
            continue
        got[pkg] = {"serve": list(zip(serve, res)), "bench": list(zip(bench, res[len(serve):])),
                    "negative": res[-2:]}
    return got


def _need(parsed: dict, pkg: str) -> dict:
    if isinstance(parsed[pkg], BaseException):
        pytest.skip(str(parsed[pkg]))
    return parsed[pkg]


@pytest.mark.parametrize("pkg", ["vllm-0.11.0", "vllm-0.6.0"])
def test_vllm_serve_commands_parsed_by_vllm(pkg, vllm_parsed):
    got = _need(vllm_parsed, pkg)
    assert got["serve"], "no vLLM server command exported for this release"
    for (name, env, argv), res in got["serve"]:
        assert res["ok"], (name, res.get("error"))
        a, job = res["args"], make_job(**case(name))
        pool = next(p for p in job.pools if p.role in ("serve", _role(argv)))
        e, p = job.engine, pool.plan
        assert (a["subparser"], a["model_tag"]) == ("serve", job.model_ref)
        assert (a["tensor_parallel_size"], a["pipeline_parallel_size"]) == (p.tp, p.pp), name
        assert a["gpu_memory_utilization"] == e.kv_memory_fraction and a["max_num_seqs"] == e.max_num_seqs
        assert (a["max_num_batched_tokens"], a["max_model_len"]) == (e.max_batched_tokens, context_len(job))
        assert a["block_size"] == e.block_size and a["enable_chunked_prefill"] == e.chunked_prefill
        assert a["kv_cache_dtype"] == ("fp8" if p.kv_dtype == "fp8" else "auto")
        assert a["quantization"] == ("fp8" if p.precision == "fp8" else None)
        replicas = pool.replicas if "--data-parallel-size" in argv and p.attn_dp == 1 else 1
        assert len(env["CUDA_VISIBLE_DEVICES"].split(",")) == p.gpus_per_replica * replicas
        if pkg == "vllm-0.6.0":
            assert a["num_scheduler_steps"] == e.multi_step == 10
        else:
            assert a["data_parallel_size"] == (replicas if replicas > 1 else p.attn_dp)
            assert a["enable_expert_parallel"] == (p.ep > 1) and a["cuda_graph_sizes"] == [e.cuda_graph_max_batch]
            kv = a["kv_transfer_config"]
            assert (kv or {}).get("kv_connector") == ("NixlConnector" if job.disaggregated else None)
            sp = p.speculation
            head = {"method": "eagle3", "model": sp.checkpoint} if sp is not None else {}
            want = None if sp is None else {"num_speculative_tokens": sp.draft_tokens} | (
                {"method": sp.method} if sp.method in ("mtp", "ngram") else head)
            assert a["speculative_config"] == want, name
    # the parsers are the releases': 0.6.0 has no data parallelism nor KV connectors, 0.11.0 has both
    assert [r["ok"] for r in got["negative"]] == ([False, False] if pkg == "vllm-0.6.0" else [True, True])


def _role(argv: list[str]) -> str:
    port = int(opt(argv, "--port")) if "--port" in argv else 0
    return {1: "prefill", 2: "decode"}.get((port % 1000) // 100, "serve")


def test_vllm_bench_commands_parsed_by_vllm(vllm_parsed):
    got = _need(vllm_parsed, "vllm-0.11.0")
    assert {n for (n, _, _), _ in got["bench"]} == {n for n in CASES if CASES[n][3].startswith(("vllm", "trtllm"))}
    for (name, _, argv), res in got["bench"]:
        assert res["ok"], (name, res.get("error"))
        a, w = res["args"], CASES[name][4]
        assert (a["subparser"], a["bench_type"], a["dataset_name"]) == ("bench", "serve", "random")
        assert (a["random_input_len"], a["random_output_len"], a["random_range_ratio"]) == (
            w.input_len, w.output_len, 0.0)
        assert a["ignore_eos"] is True and a["num_prompts"] == num_prompts(w)
        assert a["max_concurrency"] == (w.concurrency or None)
        assert a["request_rate"] == (w.rate or float("inf")) and a["port"] == 8000
        assert a["backend"] == ("openai" if CASES[name][3].startswith("trtllm") else "vllm")


@pytest.fixture(scope="module")
def sglang_parsed(exports) -> dict:
    got = {}
    for pkg, prefix in (("sglang-0.5.23", "sglang"), ("sglang-0.3.0", "sglang-0.3.0")):
        names = [n for n in CASES if _engine_of(n) == prefix]
        serve = _jobs(exports, names, "sglang.launch_server", 1)
        bench = [(n, e, a[3:]) for n in names for e, a in commands(exports[n].files["bench.sh"])
                 if not (pkg.endswith("0.3.0") and CASES[n][4].concurrency)]  # that one needs a newer client
        negative = [["--model-path", REF, "--pp-size", "2"]]
        jobs = ([{"kind": "serve", "argv": a} for _, _, a in serve] + [{"kind": "bench", "argv": a}
                for _, _, a in bench] + [{"kind": "serve", "argv": a} for a in negative])
        try:
            res = _parse(pkg, "parse_sglang.py", jobs)
        except pytest.skip.Exception as skipped:
            got[pkg] = skipped
            continue
        got[pkg] = {"serve": list(zip(serve, res)), "bench": list(zip(bench, res[len(serve):])),
                    "negative": res[-1]}
    return got


@pytest.mark.parametrize("pkg", ["sglang-0.5.23", "sglang-0.3.0"])
def test_sglang_commands_parsed_by_sglang(pkg, sglang_parsed):
    got = _need(sglang_parsed, pkg)
    assert got["serve"] and got["bench"]
    for (name, env, argv), res in got["serve"]:
        assert res["ok"], (name, res.get("error"))
        a, job = res["args"], make_job(**case(name))
        role = opt(argv, "--disaggregation-mode") if "--disaggregation-mode" in argv else "serve"
        pool = next(p for p in job.pools if p.role == role)
        e, p = job.engine, pool.plan
        assert a["model_path"] == job.model_ref and a["tp_size"] == p.moe_group  # every GPU of the server
        attention_dp = "--enable-dp-attention" in argv
        assert attention_dp == (p.attn_dp > 1) and a.get("enable_dp_attention", False) == attention_dp
        replicas = pool.replicas if "--dp-size" in argv and not attention_dp else 1
        assert a["dp_size"] == (p.attn_dp if attention_dp else replicas)
        assert a["mem_fraction_static"] == e.kv_memory_fraction and a["max_running_requests"] == e.max_num_seqs
        assert a["chunked_prefill_size"] == e.max_batched_tokens and a["max_prefill_tokens"] == e.max_batched_tokens
        assert a["context_length"] == context_len(job)
        assert a["enable_mixed_chunk"] == (e.mixed_batches and e.chunked_prefill)
        assert a["kv_cache_dtype"] == ({"sglang-0.3.0": "fp8_e5m2"}.get(pkg, "fp8_e4m3") if p.kv_dtype == "fp8"
                                       else "auto")
        assert a["quantization"] == ("fp8" if p.precision == "fp8" else None)
        assert len(env["CUDA_VISIBLE_DEVICES"].split(",")) == min(8, p.gpus_per_replica) * replicas
        if pkg == "sglang-0.5.23":
            assert (a["pp_size"], a["page_size"], a["cuda_graph_max_bs_decode"]) == (
                p.pp, e.block_size, e.cuda_graph_max_batch)
            assert a["ep_size"] == (p.ep if job.model.is_moe else 1)
            assert a["disaggregation_mode"] == ("null" if role == "serve" else role)
            assert a["nnodes"] == -(-p.gpus_per_replica // 8)
            sp = p.speculation
            spec = (a["speculative_algorithm"], a["speculative_num_steps"], a["speculative_eagle_topk"],
                    a["speculative_num_draft_tokens"], a["speculative_draft_model_path"])
            assert spec == ((None,) * 5 if sp is None else (
                {"mtp": "NEXTN", "draft": "STANDALONE", "ngram": "NGRAM"}.get(sp.method, "EAGLE3"), sp.draft_tokens, 1,
                sp.draft_tokens + 1, sp.checkpoint or None)), name
    for (name, _, argv), res in got["bench"]:
        assert res["ok"], (name, res.get("error"))
        a, w = res["args"], CASES[name][4]
        assert (a["backend"], a["dataset_name"], a["port"]) == ("sglang", "random", 30000)
        assert (a["random_input_len"], a["random_output_len"], a["random_range_ratio"]) == (
            w.input_len, w.output_len, 1.0)
        assert a["num_prompts"] == num_prompts(w) and a["request_rate"] == (w.rate or float("inf"))
        assert a.get("max_concurrency") == (w.concurrency or None) and a["disable_ignore_eos"] is False
    assert got["negative"]["ok"] is (pkg == "sglang-0.5.23")  # 0.3.0 has no --pp-size


# ---------------------------------------------------------------- TensorRT-LLM: options read from its source
_REFERENCE = tomllib.loads((GOLDEN / "trtllm_reference.toml").read_text())


def _click_command(version: str, section: str = "serve", model_argument: bool = True):
    import click

    types = {"int": click.INT, "float": click.FLOAT, "str": click.STRING}
    params = [click.Argument(["model"])] if model_argument else []
    for o in _REFERENCE[section][version]["options"]:
        decls = o["names"] + ([o["dest"]] if "dest" in o else [])
        if o["type"] == "flag":
            params.append(click.Option(decls, is_flag=True, default=False))
        elif o["type"] == "choice":
            params.append(click.Option(decls, type=click.Choice(o["choices"])))
        else:
            params.append(click.Option(decls, type=types[o["type"]]))
    return click.Command("trtllm-serve", params=params)


def _llm_api_model(version: str, name: str = "top"):
    """A pydantic model refusing unknown keys (TensorRT-LLM's StrictBaseModel) from the reference's fields."""
    from pydantic import ConfigDict, Field, create_model

    fields = {}
    for key, spec in _REFERENCE["llm_api"][version][name].items():
        spec = {"type": spec} if isinstance(spec, str) else spec
        kind = spec.get("type", "choice")
        nullable, kind = kind.endswith("?"), kind.rstrip("?")
        typ = (Literal[tuple(spec["choices"])] if kind == "choice" else
               {"int": int, "float": float, "bool": bool, "str": str, "int[]": list[int]}.get(kind)
               or _llm_api_model(version, kind))
        bounds = {k: spec[k] for k in ("ge", "le") if k in spec}
        fields[key] = (Optional[typ] if nullable else typ, Field(None, **bounds))
    return create_model(f"Trtllm{name}", __config__=ConfigDict(extra="forbid", strict=True), **fields)


def _yaml(text: str) -> dict:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load(text)


@pytest.mark.parametrize("name", [n for n in CASES if CASES[n][3].startswith("trtllm")])
def test_trtllm_exports_against_its_source(name, exports):
    out, job = exports[name], make_job(**case(name))
    version = "1.2" if job.engine.name == "trtllm" else "0.17"
    cmd = _click_command(version)
    for env, argv in servers(out.files["launch.sh"], "trtllm-serve"):
        if argv[1] == "disaggregated":
            ctx = _click_command(version, "disaggregated", model_argument=False).make_context("x", argv[2:])
            cfg = _yaml(out.files[ctx.params["config_file"]])
            ref = _REFERENCE["disaggregated"][version]
            assert set(cfg) <= set(ref["top_keys"]) and cfg["port"] == 8000
            for key, pool in (("context_servers", job.pools[0]), ("generation_servers", job.pools[1])):
                assert set(cfg[key]) <= set(ref["server_keys"]) and cfg[key]["num_instances"] == pool.replicas
                assert len(cfg[key]["urls"]) == pool.replicas and all(":" in u for u in cfg[key]["urls"])
            continue
        params = cmd.make_context("trtllm-serve", argv[1:]).params
        port = params["port"]
        pool = job.pools[0] if not job.disaggregated else job.pools[0 if port < 8200 else 1]
        e, p = job.engine, pool.plan
        assert params["model"] == job.model_ref and params["max_seq_len"] == context_len(job)
        tp = params.get("tensor_parallel_size", params.get("tp_size"))
        pp = params.get("pipeline_parallel_size", params.get("pp_size"))
        ep = params.get("moe_expert_parallel_size", params.get("ep_size"))
        # under enable_attention_dp, trtllm-serve's tp counts every rank (attention data-parallel over them)
        assert (tp, pp, ep) == (p.moe_group, p.pp, p.ep if job.model.is_moe and p.ep > 1 else None)
        assert (params["max_batch_size"], params["max_num_tokens"]) == (e.max_num_seqs, e.max_batched_tokens)
        frac = params.get("free_gpu_memory_fraction", params.get("kv_cache_free_gpu_memory_fraction"))
        assert frac == e.kv_memory_fraction and len(env["CUDA_VISIBLE_DEVICES"].split(",")) == p.gpus_per_replica
        if version == "0.17":
            assert params["backend"] is None and "extra_llm_api_options" not in params
            continue
        assert params["backend"] == "pytorch"
        opts = _llm_api_model(version).model_validate(_yaml(out.files[params["extra_llm_api_options"]]))
        assert opts.kv_cache_config.free_gpu_memory_fraction == e.kv_memory_fraction
        assert opts.kv_cache_config.tokens_per_block == e.block_size
        assert opts.kv_cache_config.dtype == ("fp8" if p.kv_dtype == "fp8" else "auto")
        assert opts.cuda_graph_config.batch_sizes[-1] == e.cuda_graph_max_batch
        assert opts.enable_chunked_prefill == e.chunked_prefill
        assert (opts.cache_transceiver_config is not None) == job.disaggregated
        assert opts.scheduler_config.capacity_scheduler_policy == "GUARANTEED_NO_EVICT"  # admission 'reserve'
        assert bool(opts.enable_attention_dp) == (p.attn_dp > 1)
        sp, got = p.speculation, opts.speculative_config
        assert (got is None) == (sp is None)
        if sp is not None:
            kind = {"mtp": "MTP", "ngram": "NGram", "draft": "Draft_Target"}.get(sp.method, "Eagle3")
            assert got.decoding_type == kind and got.speculative_model_dir == (sp.checkpoint or None)
            assert (got.num_nextn_predict_layers if sp.method == "mtp" else got.max_draft_len) == sp.draft_tokens


def test_trtllm_reference_refuses_what_the_source_does_not_have():
    import click

    with pytest.raises(click.UsageError):
        _click_command("0.17").make_context("trtllm-serve", ["m", "--extra_llm_api_options", "x.yaml"])
    with pytest.raises(Exception, match="extra"):
        _llm_api_model("1.2").model_validate({"kv_cache_config": {"free_gpu_memory_fraction": 0.9, "typo": 1}})
    with pytest.raises(Exception, match="less than or equal"):
        _llm_api_model("1.2").model_validate({"kv_cache_config": {"free_gpu_memory_fraction": 1.5}})
