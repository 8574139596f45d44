"""Engines no visible serving row runs (TGI, LMDeploy, DeepSpeed-FastGen): their profiles are read from their code,
a row naming them is predicted instead of skipped, their launch-time sizing rules reproduce the tools' own
arithmetic, and the search stays inside what they can run (no pipeline stages, no disaggregation)."""

from __future__ import annotations

import pytest

from meshplan import catalog
from meshplan.calibrate.serve_constants import load_constants
from meshplan.calibrate.serve_validate import validate_serving_csv
from meshplan.cost.serve_sizing import sized_engine
from meshplan.errors import SpecError
from meshplan.search.serve import search
from meshplan.search.serve_request import ServeRequest, Slo
from meshplan.search.serve_space import pp_options
from meshplan.spec.serving import ServePlan, Workload

WORK = Workload(input_len=1000, output_len=1000, concurrency=16)


@pytest.mark.parametrize("text, name", [
    ("TGI 3.0.1", "tgi"), ("text-generation-inference 2.4.0", "tgi-2"), ("Text Generation Inference", "tgi"),
    ("LMDeploy 0.6.0", "lmdeploy"), ("lmdeploy (TurboMind)", "lmdeploy"),
    ("DeepSpeed-FastGen", "fastgen"), ("DeepSpeed-MII 0.2.3", "fastgen"),
    ("NIM 1.3.0", "nim-1.8"), ("nvidia nim 1.8", "nim-1.8"),  # a NIM by prefix, whatever its case
    # llm-d runs vLLM: its own release number is not vLLM's, the vLLM one in the text is
    ("llm-d v0.2", "vllm"), ("llm-d 0.2 (vLLM 0.6.3)", "vllm-0.6"), ("llm-d 0.3, vLLM 0.10.1", "vllm"),
])
def test_engine_for_reads_the_new_families(text, name):
    assert catalog.engine_for(text)[0].name == name


def test_tgi_sizes_its_prefill_budget_as_its_launcher_does():
    """tgi@v3.3.7 compute_optimal: the card's f16 FLOPs x shards // the model's FLOPs per token, by hand for
    Llama-3.1-8B (32 layers of 2 x (3 x 32 + 2 x 8) x 128 x 4096 attention + 6 x 4096 x 14336 MLP FLOPs), capped
    by the positions; a card TGI's table lacks (B200) gets 4096."""
    model = catalog.model("llama3.1-8b")
    per_token = (2 * (3 * 32 + 2 * 8) * 128 * 4096 + 6 * 4096 * 14336) * 32
    for gpu, flops, tp in (("h100-sxm", 900e12, 1), ("h100-sxm", 900e12, 2), ("l4", 121e12, 1)):
        pool = catalog.cluster(f"{tp}x{gpu}").pools[0]
        e = sized_engine(catalog.engine("tgi"), model, ServePlan(tp=tp, engine="tgi"), pool, WORK)
        want = min(int(flops * tp // per_token), model.max_seq_len)
        assert e.max_batched_tokens == e.activation_tokens == want
    b200 = catalog.cluster("1xb200").pools[0]
    assert sized_engine(catalog.engine("tgi"), model, ServePlan(engine="tgi"), b200, WORK).max_batched_tokens == 4096


def test_tgi_caps_its_prefill_budget_by_the_memory_the_weights_leave():
    """tgi@v3.3.7 vram_maximum: 0.95 x the shards' memory x --cuda-memory-fraction (the profile's KV fraction over
    the 0.90 wiggle room), less TGI's own count of the 16-bit weights, over its bytes per token. Llama-3.1-70B on
    2 H100 at a KV fraction of 0.75: by hand, below compute_optimal's 12,195, so it binds; a quantized int4
    checkpoint skips the rule (TGI returns None)."""
    from dataclasses import replace

    model, pool = catalog.model("llama3.1-70b"), catalog.cluster("2xh100-sxm").pools[0]
    tgi = replace(catalog.engine("tgi"), kv_memory_fraction=0.75)
    params = ((64 + 2 * 8) * 128 + 64 * 128 * 8192 + 3 * 28672 * 8192) * 80 + 2 * 8192 * 128256
    per_token = 8 * 2 * 128 * 2 * 80 + (28672 + 14336) * 2 * 3
    want = int((0.95 * pool.gpu.hbm_bytes * 2 * 0.75 / 0.90 - 2 * params) // per_token)
    assert want < 12195
    got = sized_engine(tgi, model, ServePlan(tp=2, engine="tgi"), pool, WORK)
    assert got.max_batched_tokens == want
    quantized = sized_engine(tgi, model, ServePlan(tp=2, precision="int4", engine="tgi"), pool, WORK)
    assert quantized.max_batched_tokens == 2 * 900e12 // ((2 * (3 * 64 + 2 * 8) * 128 * 8192
                                                           + 6 * 8192 * 28672) * 80)


def test_lmdeploy_sizes_its_batch_by_card():
    """lmdeploy@v0.16.0 get_max_batch_size: 1024 on H100/H200 (GH200 reads as H200), 384 on A100, else 128; the
    TurboMind forward budget is max_prefill_token_num (8192) plus that batch."""
    model = catalog.model("llama3.1-8b")
    for gpu, batch in (("h100-sxm", 1024), ("gh200", 1024), ("a100-80gb", 384), ("l40s", 128), ("b200", 128)):
        pool = catalog.cluster(f"1x{gpu}").pools[0]
        e = sized_engine(catalog.engine("lmdeploy"), model, ServePlan(engine="lmdeploy"), pool, WORK)
        assert (e.max_num_seqs, e.max_batched_tokens) == (batch, 8192 + batch)


def test_vllm_v1_sizes_its_step_budget_by_card():
    """vllm@v0.11.0 get_batch_defaults (API server): 8192 tokens and 1024 sequences from 70 GiB of device memory
    up, except on an A100; 2048 and 256 below that and on every A100 (A800 80 GB takes the larger ones)."""
    model = catalog.model("llama3.1-8b")
    for gpu, want in (("h100-sxm", (8192, 1024)), ("mi300x", (8192, 1024)), ("a800", (8192, 1024)),
                      ("a100-80gb", (2048, 256)), ("l40s", (2048, 256)), ("l4", (2048, 256))):
        pool = catalog.cluster(f"1x{gpu}").pools[0]
        e = sized_engine(catalog.engine("vllm"), model, ServePlan(engine="vllm"), pool, WORK)
        assert (e.max_batched_tokens, e.max_num_seqs) == want and e.activation_tokens == want[0]


def test_sglang_sizes_chunk_graphs_and_static_memory_by_card():
    """sglang@v0.5.23 handle_gpu_memory_settings, by hand: an L40S (below 60 GiB) at TP 1 chunks prompts by 4096
    and captures decode graphs to 32, reserving 512 + 4096 x 1.5 + 1/8 GiB + 32 x 2 + 8 MiB for each of the 50
    prefill graph sizes up to 4096 MiB; an H100 at TP 8 chunks by 8192, captures to 512 and reserves
    512 + 8192 x 1.5 + 1024 + 1024 + 8 x 58 MiB (above the 10 GiB floor); a B200 chunks by 16384 (74 prefill sizes)."""
    model = catalog.model("llama3.1-8b")
    for gpu, tp, chunk, graphs, prefill_sizes in (("l40s", 1, 4096, 32, 50), ("h100-sxm", 8, 8192, 512, 58),
                                                  ("b200", 8, 16384, 512, 74)):
        pool = catalog.cluster(f"{tp}x{gpu}").pools[0]
        e = sized_engine(catalog.engine("sglang"), model, ServePlan(tp=tp, engine="sglang"), pool, WORK)
        mib = pool.gpu.hbm_bytes / 2**20
        reserve = max(512 + chunk * 1.5 + tp / 8 * 1024 + graphs * 2 + 8 * prefill_sizes,
                      10 * 1024 if mib > 60 * 1024 else 0)
        assert (e.max_batched_tokens, e.activation_tokens, e.cuda_graph_max_batch) == (chunk, chunk, graphs)
        assert e.kv_memory_fraction == round((mib - reserve) / mib, 3)


@pytest.mark.parametrize("text, name", [
    ("TensorRT-LLM 1.0 (trtllm-bench, PyTorch backend)", "trtllm-bench"), ("trtllm-bench (TensorRT-LLM 1.1)",
                                                                           "trtllm-bench"),
    ("TensorRT-LLM 0.19 (trtllm-bench, TRT engine flow)", "trtllm-0.17"), ("TensorRT-LLM 1.1 trtllm-serve", "trtllm"),
])
def test_trtllm_bench_rows_from_1_0_take_the_bench_harness(text, name):
    assert catalog.engine_for(text)[0].name == name


def test_trtllm_bench_pytorch_sizes_batch_tokens_and_graphs():
    """trtllm-bench throughput, PyTorch backend, by hand for Llama-3.1-8B fp8 (fp8 KV) on one H200 at 1000/1000:
    0.90 of the memory the 1-byte weights leave over 2 x 32 layers x 8 kv heads x 128 x 1 B a token for 2000
    tokens a request gives the raw batch, rounded up by 128 between 256 and 1024; tokens = batch x (1 + 1), by
    1024 above 8192, at least the longest prompt plus the batch; CUDA graphs up to the batch."""
    import math

    from meshplan.cost.memory import model_params

    model, pool = catalog.model("llama3.1-8b"), catalog.cluster("1xh200").pools[0]
    plan = ServePlan(precision="fp8", kv_dtype="fp8", engine="trtllm-bench")
    e = sized_engine(catalog.engine("trtllm-bench"), model, plan, pool, WORK)
    requests = 0.90 * (pool.gpu.hbm_bytes - model_params(model)) / (2 * 32 * 8 * 128 * 2000)
    assert 256 <= requests < 1024
    batch = 128 * math.ceil(requests / 128)
    raw_tokens = batch * 2
    tokens = max(2048, 256 * math.ceil(raw_tokens / 256)) if raw_tokens < 4096 else (
        512 * math.ceil(raw_tokens / 512) if raw_tokens < 8192 else 1024 * math.ceil(raw_tokens / 1024))
    assert (e.max_num_seqs, e.max_batched_tokens, e.cuda_graph_max_batch) == (batch, max(tokens, 1000 + batch),
                                                                              batch)


def test_a_pinned_cap_moves_turbomind_s_step_budget_with_it():
    """TurboMind's forward budget is max_prefill_token_num + max_batch_size: pinning --max-num-seqs 64 gives 8256."""
    base = dict(model=catalog.model("llama3.1-8b"), cluster=catalog.cluster("1xh100-sxm"),
                engine=catalog.engine("lmdeploy"), work=WORK, slo=Slo(), constants=load_constants(), disagg="off")
    best = search(ServeRequest(**base, max_num_seqs=64)).best
    assert (best.engine.max_num_seqs, best.engine.max_batched_tokens) == (64, 8192 + 64)


def test_a_tgi_row_is_predicted_not_skipped(tmp_path):
    """A serving CSV row of an engine no visible row runs gets a prediction from its profile."""
    head = ("id,source,url_or_repo_path,model,model_key,gpu,gpu_key,n_gpus,tp,pp,dp,ep,precision,framework,"
            "input_len,output_len,concurrency,batch,metric,value,unit,notes")
    rows = ["t1,x,,Llama-3.1-8B,llama3.1-8b,H100,h100-sxm,1,1,1,1,1,bf16,TGI 3.0.1,1000,1000,16,,itl_ms,10,ms,",
            "t2,x,,Llama-3.1-8B,llama3.1-8b,H100,h100-sxm,1,1,1,1,1,bf16,LMDeploy 0.7.0,1000,1000,16,,itl_ms,10,ms,",
            "t3,x,,Llama-3.1-8B,llama3.1-8b,H100,h100-sxm,1,1,1,1,1,bf16,DeepSpeed-FastGen,1000,1000,16,,itl_ms,10,ms,"]
    path = tmp_path / "rows.csv"
    path.write_text("\n".join([head, *rows]) + "\n")
    report = validate_serving_csv(path, load_constants())
    assert [r.engine for r in report.rows] == ["tgi", "lmdeploy", "fastgen"] and not report.skipped
    assert all(5.0 < r.predicted < 20.0 for r in report.rows)  # an 8B decode step on one H100: a few ms to ~15


def test_the_search_stays_inside_what_tgi_runs():
    """TGI shards by TP only and serves prefill and decode in one engine: no pipeline stage, no disaggregated
    candidate, and pinning either is a one-line error."""
    assert pp_options(catalog.model("llama3.1-70b"), 8, 2, 0, most=1) == [1]
    base = dict(model=catalog.model("llama3.1-70b"), cluster=catalog.cluster("8xh100-sxm"),
                engine=catalog.engine("tgi"), work=WORK, slo=Slo(), constants=load_constants())
    result = search(ServeRequest(**base))
    assert result.candidates and all(c.plan.pp == 1 and not c.disaggregated for c in result.candidates)
    with pytest.raises(SpecError, match="--pp"):
        ServeRequest(**base, pp=2)
    with pytest.raises(SpecError, match="--disagg"):
        ServeRequest(**base, disagg="only")


def test_the_search_tries_no_running_cap_tgi_3_ignores():
    """TGI 3 ignores --max-batch-size under prefill chunking (seq_cap_settable = false): the search keeps the
    profile's cap and a pinned one is a one-line error; TGI 2 honours the flag, so lower caps are tried there."""
    from meshplan.search.serve_space import engine_options

    base = dict(model=catalog.model("llama3.1-70b"), cluster=catalog.cluster("8xh100-sxm"), work=WORK, slo=Slo(),
                constants=load_constants())
    tgi3 = ServeRequest(**base, engine=catalog.engine("tgi"))
    assert engine_options(tgi3) == [catalog.engine("tgi")]
    assert all(c.seq_cap == 0 for c in search(tgi3).candidates)
    with pytest.raises(SpecError, match="--max-num-seqs.*backend.rs"):
        ServeRequest(**base, engine=catalog.engine("tgi"), max_num_seqs=8)
    heavy = {**base, "work": Workload(input_len=1000, output_len=1000, concurrency=512)}
    assert len(engine_options(ServeRequest(**heavy, engine=catalog.engine("tgi-2")))) > 1
    assert len(engine_options(ServeRequest(**heavy, engine=catalog.engine("tgi")))) == 1


def test_export_of_an_engine_without_an_exporter_is_refused_before_the_search(tmp_path):
    """The runtime's own decoder has no launch to write: one line naming the exporters, exit 2, nothing written."""
    import subprocess
    import sys

    out = tmp_path / "serve"
    args = ["serve", "--model", "llama3.1-8b", "--gpus", "1xh100-sxm", "--engine", "meshplan", "--input-len", "100",
            "--output-len", "100", "--export", str(out), "--checkpoint", "x"]
    got = subprocess.run([sys.executable, "-m", "meshplan.cli", *args], capture_output=True, text=True, timeout=120)
    assert got.returncode == 2 and not out.exists()
    assert got.stderr.count("\n") == 1 and "vllm, sglang, trtllm, tgi, lmdeploy" in got.stderr


@pytest.mark.parametrize("engine, pp_ok", [("trtllm-0.17", True), ("vllm-0.6.0", True), ("sglang-0.3.0", False)])
def test_older_releases_are_not_offered_what_their_exports_refuse(engine, pp_ok):
    """TensorRT-LLM 0.17 and vLLM 0.6.0 have no disaggregated launch and SGLang 0.3.0 no --pp-size either: the
    search offers neither, so its winner always exports."""
    base = dict(model=catalog.model("llama3.1-70b"), cluster=catalog.cluster("8xh100-sxm"),
                engine=catalog.engine(engine), work=WORK, slo=Slo(), constants=load_constants())
    cands = search(ServeRequest(**base)).candidates
    assert cands and not any(c.disaggregated for c in cands)
    assert any(c.plan.pp > 1 for c in cands) is pp_ok


def test_a_row_s_expert_parallelism_is_read_or_refused(tmp_path):
    """The ep column reaches the plan (Mixtral tp 4, ep 4: whole experts on each rank; tp 1, ep 4 on 4 GPUs:
    four data-parallel attention groups with the experts over all of them); ep on a dense model, or data-parallel
    attention on an engine that has none, is a skipped row with its reason."""
    head = ("id,source,url_or_repo_path,model,model_key,gpu,gpu_key,n_gpus,tp,pp,dp,ep,precision,framework,"
            "input_len,output_len,concurrency,batch,metric,value,unit,notes")
    body = ["m,x,,Mixtral,mixtral-8x7b,H100,h100-sxm,4,4,1,1,4,bf16,vLLM 0.11.0,1000,1000,16,,itl_ms,10,ms,",
            "d,x,,Llama,llama3.1-8b,H100,h100-sxm,2,2,1,1,2,bf16,vLLM 0.11.0,1000,1000,16,,itl_ms,10,ms,",
            "w,x,,Mixtral,mixtral-8x7b,H100,h100-sxm,4,1,1,4,4,bf16,vLLM 0.11.0,1000,1000,16,,itl_ms,10,ms,",
            "o,x,,Mixtral,mixtral-8x7b,H100,h100-sxm,4,1,1,4,4,bf16,vLLM 0.6.3,1000,1000,16,,itl_ms,10,ms,"]
    path = tmp_path / "rows.csv"
    path.write_text("\n".join([head, *body]) + "\n")
    report = validate_serving_csv(path, load_constants())
    assert [r.id for r in report.rows] == ["m", "w"]
    why = dict(report.skipped)
    assert "no experts" in why["d"] and "data-parallel attention" in why["o"]


@pytest.mark.parametrize("flag, value", [("--pp", "2"), ("--disagg", "only")])
def test_the_cli_refuses_a_layout_the_engine_cannot_run_in_one_line(flag, value):
    import subprocess
    import sys

    args = ["serve", "--model", "llama3.1-70b", "--gpus", "8xh100-sxm", "--engine", "tgi", "--input-len", "100",
            "--output-len", "100", flag, value]
    got = subprocess.run([sys.executable, "-m", "meshplan.cli", *args], capture_output=True, text=True, timeout=120)
    assert got.returncode == 2 and got.stderr.count("\n") == 1 and flag in got.stderr and "tgi" in got.stderr


def test_fastgen_holds_at_most_its_max_context_per_sequence():
    """DeepSpeed inference v2 sizes its KV metadata for 8192 tokens per sequence (DSStateManagerConfig
    max_context), whatever the model's context: a longer request is a one-line error naming the limit; one that
    fits is planned."""
    assert catalog.engine("fastgen").max_context == 8192 and catalog.engine("vllm").max_context == 0
    base = dict(model=catalog.model("llama3.1-8b"), cluster=catalog.cluster("1xh100-sxm"),
                engine=catalog.engine("fastgen"), slo=Slo(), constants=load_constants())
    with pytest.raises(SpecError, match="8,192 tokens one sequence of fastgen holds"):
        ServeRequest(**base, work=Workload(input_len=8000, output_len=500, concurrency=4))
    ok = ServeRequest(**base, work=Workload(input_len=7000, output_len=1192, concurrency=4))
    assert search(ok).candidates
    # vLLM takes the model's 131,072-token context: the same long request is planned
    assert search(ServeRequest(**{**base, "engine": catalog.engine("vllm")},
                               work=Workload(input_len=8000, output_len=500, concurrency=4))).candidates


def test_cli_refuses_a_request_beyond_fastgen_max_context():
    import subprocess
    import sys

    args = ["serve", "--model", "llama3.1-8b", "--gpus", "1xh100-sxm", "--engine", "fastgen", "--input-len", "9000",
            "--output-len", "100"]
    got = subprocess.run([sys.executable, "-m", "meshplan.cli", *args], capture_output=True, text=True, timeout=120)
    assert got.returncode == 2 and got.stderr.count("\n") == 1 and "max_context" in got.stderr


def test_tgi_reads_config_intermediate_size_for_moe_models():
    """TGI's Config (tgi@v3.3.7 launcher/src/main.rs) takes config.json's intermediate_size, num_experts_per_tok,
    n_shared_experts, num_local_experts and head_dim (else hidden / heads): DeepSeek-V3 reads 18432 (its dense
    layers, not the experts' 2048), 8 + 1 experts per token, 1 expert (its count is n_routed_experts) and head_dim
    56 (MLA configs carry none); Qwen3-30B-A3B 6144 and 1 expert (num_experts); Mixtral 14336 and 8. FLOPs per token
    by hand for DeepSeek-V3's 61 layers."""
    from meshplan.cost.serve_sizing import _tgi_ffn, _tgi_flop_per_token, _tgi_head_dim

    assert _tgi_ffn(catalog.model("deepseek-v3")) == (18432, 9, 1) and _tgi_head_dim(catalog.model("deepseek-v3")) == 56
    assert _tgi_ffn(catalog.model("qwen3-30b-a3b")) == (6144, 8, 1)
    assert _tgi_ffn(catalog.model("mixtral-8x7b")) == (14336, 2, 8)
    assert _tgi_head_dim(catalog.model("qwen3-32b")) == 128  # its config's head_dim, not 5120 / 64
    per_layer = 2 * (3 * 128 + 2 * 128) * 56 * 7168 + 6 * 7168 * 18432 * 9
    assert _tgi_flop_per_token(catalog.model("deepseek-v3")) == per_layer * 61
