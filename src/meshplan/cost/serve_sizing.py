"""Engine caps the engine or its benchmark tool sizes before it runs (``EngineProfile.build_sizing``).

trtllm-bench builds its TensorRT engine for the dataset it will run: ``max_batch_size`` and ``max_num_tokens``
come from the requests the KV cache can hold at the dataset's lengths, not from trtllm-build's defaults
(NVIDIA/TensorRT-LLM tensorrt_llm/bench/build/tuning.py ``calc_engine_setting`` and ``finetune_setting``; the
perf-overview tables are measured on engines built that way). The rule is the tool's own estimate, reproduced
as it is written (whole-model KV bytes with the KV heads raised to tp, weights as parameters x element size,
95 % of the memory left), so the caps match what the tool chose even where the engine's real memory differs.
"""

from __future__ import annotations

import math
from dataclasses import replace

from meshplan.cost.memory import model_params
from meshplan.cost.serve_memory import kv_bytes_per_token_per_gpu
from meshplan.spec.cluster import Pool
from meshplan.spec.engine import EngineProfile
from meshplan.spec.model import ModelSpec
from meshplan.spec.serving import ServePlan, Workload

GiB = 1024.0**3


def _trtllm_bench(engine: EngineProfile, model: ModelSpec, plan: ServePlan, pool: Pool,
                  work: Workload) -> EngineProfile:
    """trtllm-bench's ``max_batch_size`` and ``max_num_tokens`` for ``work`` on ``plan`` (module docstring)."""
    bs, tokens = _bench_caps(model, plan, pool, work, fraction=0.95)
    return replace(engine, max_num_seqs=bs, max_batched_tokens=tokens, activation_tokens=tokens)


def _trtllm_bench_pytorch(engine: EngineProfile, model: ModelSpec, plan: ServePlan, pool: Pool,
                          work: Workload) -> EngineProfile:
    """trtllm-bench throughput on the PyTorch backend (TensorRT-LLM 1.x bench/benchmark/utils/general.py
    ``get_settings``): the same heuristic at the command's ``--kv_cache_free_gpu_mem_fraction`` (0.90); without
    chunked prefill the token budget grows to hold the longest prompt beside a full batch (max_isl +
    max_batch_size), and CUDA graphs are captured, padded, up to the batch."""
    bs, tokens = _bench_caps(model, plan, pool, work, fraction=engine.kv_memory_fraction)
    if not engine.chunked_prefill:
        longest = max(n for n, _ in work.bins("input"))  # the dataset's max_isl
        tokens = max(tokens, longest + bs)
    return replace(engine, max_num_seqs=bs, max_batched_tokens=tokens, activation_tokens=tokens,
                   cuda_graph_max_batch=bs)


def _bench_caps(model: ModelSpec, plan: ServePlan, pool: Pool, work: Workload, *,
                fraction: float) -> tuple[int, int]:
    """tuning.py ``calc_engine_setting`` and ``finetune_setting`` (max_batch_size, max_num_tokens)."""
    gpus = plan.tp * plan.pp
    # calc_engine_setting: byte_per_token = 2 x attention layers x max(tp, n_kv) x head_size x KV element bytes
    # (all ranks together), which is this model's KV per GPU times the replica's GPUs.
    per_token = kv_bytes_per_token_per_gpu(model, plan) * gpus
    engine_bytes = model_params(model) * plan.weight_bytes  # param_count x bytes per element
    # kv_cache_gpu_mem_fraction of the rest (0.95 at trtllm-bench build, the throughput command's 0.90 on the
    # PyTorch backend); the tool reads NVML's total (utils.get_device_memory), about 0.6 % above the CUDA-visible
    # memory the catalog holds
    cache = fraction * (pool.gpu.hbm_bytes * gpus - engine_bytes)
    requests = max(cache / (per_token * (work.input_len + work.output_len)), 1.0)
    # finetune_setting: the batch capped at 4096 over pp, tokens at batch x (1 + ISL/OSL) capped at 32768
    raw_bs = min(requests, 4096) / plan.pp
    raw_tokens = min(raw_bs * (1 + work.input_len / work.output_len), 32768)
    bs = _round_up(raw_bs, ((256, 32), (1024, 128), (math.inf, 256)), least=64)
    tokens = _round_up(raw_tokens, ((4096, 256), (8192, 512), (math.inf, 1024)), least=2048)
    return bs, tokens


def _vllm_v0(engine: EngineProfile, model: ModelSpec, plan: ServePlan, pool: Pool,
             work: Workload) -> EngineProfile:
    """vLLM V0's scheduler caps from the model: chunked prefill is on by default only when the model's context
    exceeds 32K tokens (vllm@v0.6.3 vllm/engine/arg_utils.py ``use_long_context``), within the profile's token
    budget shared with the decodes; else a step runs prompts or decodes, never both, up to max(max_model_len,
    2048) tokens (vllm/config.py SchedulerConfig). The profile run that sizes activations is one such step."""
    context = model.max_seq_len or V0_DEFAULT_CONTEXT
    if context > V0_LONG_CONTEXT:
        return replace(engine, chunked_prefill=True, mixed_batches=True, activation_tokens=engine.max_batched_tokens)
    tokens = max(context, 2048)
    return replace(engine, chunked_prefill=False, mixed_batches=False, max_batched_tokens=tokens,
                   activation_tokens=tokens)


V0_LONG_CONTEXT = 32768
"""vLLM V0 turns chunked prefill on by default above this max_model_len (arg_utils.py, 0.5.3-0.7.3)."""
V0_DEFAULT_CONTEXT = 2048
"""max_model_len when a model names no trained length: vLLM's fallback in vllm/config.py _get_and_verify_max_len."""


def _vllm_v1(engine: EngineProfile, model: ModelSpec, plan: ServePlan, pool: Pool,
             work: Workload) -> EngineProfile:
    """vLLM V1's API-server defaults by card (vllm@v0.11.0 vllm/engine/arg_utils.py ``get_batch_defaults``, since
    0.9.0, PR #17885): 8192 batched tokens and 1024 sequences on a GPU of at least 70 GiB other than an A100 (the
    profile's), else 2048 and 256; never above the profile's own caps. The profile run that sizes the activations
    is one step of that budget."""
    if pool.gpu.hbm_bytes >= V1_LARGE_GPU_BYTES and "a100" not in pool.gpu.name:
        return engine
    tokens = min(engine.max_batched_tokens, V1_SMALL_GPU_TOKENS)
    return replace(engine, max_batched_tokens=tokens, activation_tokens=min(engine.activation_tokens, tokens),
                   max_num_seqs=min(engine.max_num_seqs, V1_SMALL_GPU_SEQS))


V1_LARGE_GPU_BYTES = 70 * GiB
"""vLLM V1 gives the larger defaults from this total device memory up (``device_memory >= 70 * GiB_bytes``)."""
V1_SMALL_GPU_TOKENS = 2048
"""vLLM V1's API-server ``max_num_batched_tokens`` below that, and on every A100."""
V1_SMALL_GPU_SEQS = 256
"""vLLM V1's ``max_num_seqs`` below that, and on every A100."""


def _sglang(engine: EngineProfile, model: ModelSpec, plan: ServePlan, pool: Pool,
            work: Workload) -> EngineProfile:
    """SGLang's defaults by card (sglang@v0.5.23 python/sglang/srt/arg_groups/memory_hook.py
    ``handle_gpu_memory_settings``): the chunked-prefill size and the decode CUDA-graph batch cap by the device's
    memory and the TP size, then ``mem_fraction_static`` = (memory - reserve) / memory, the reserve being 512 MiB,
    1.5 MiB per token of the chunk (at least 2048), 1 GiB per 8 GPUs of tp x pp, the decode graphs (2 MiB per
    batch slot; DP attention 3 more per slot and group, 1.5 past 300 slots) and the prefill graphs (8 MiB per
    captured token count, 1.5 GiB under MLA), at least 10 GiB on a card above 60 GiB."""
    mib = pool.gpu.hbm_bytes / 2**20
    sglang_tp = plan.tp * plan.attn_dp  # --tp-size spans the attention-DP groups (--dp-size)
    chunk, graphs = next(tier for limit, *tier in _sglang_tiers(sglang_tp) if mib < limit)
    mla = any(b.layer.attention is not None and b.layer.attention.kind == "mla" for b in model.blocks)
    reserve = 512 + max(chunk, 2048) * 1.5 + sglang_tp * plan.pp / 8 * 1024 + graphs * 2
    if plan.attn_dp > 1:
        reserve += graphs * plan.attn_dp * (4.5 if graphs > 300 else 3)
    reserve += 1.5 * 1024 if mla else 8 * len(_prefill_graph_tokens(chunk))
    if mib > 60 * 1024:
        reserve = max(reserve, 10 * 1024)
    return replace(engine, max_batched_tokens=chunk, activation_tokens=chunk, cuda_graph_max_batch=graphs,
                   kv_memory_fraction=round((mib - reserve) / mib, 3))


def _sglang_tiers(tp: int) -> tuple[tuple[float, int, int], ...]:
    """(memory below, MiB; chunked-prefill tokens; decode graph batch cap) of memory_hook.py's table: T4-class,
    A10/4090/5090, A100-40GB/L40, H100/A100-80GB, H20/H200, then B200/MI300."""
    small = tp < 4
    return ((20 * 1024, 2048, 8), (35 * 1024, 4096, 48 if small else 160), (60 * 1024, 4096, 32 if small else 160),
            (90 * 1024, 8192, 256 if small else 512), (160 * 1024, 8192, 256 if small else 512),
            (math.inf, 16384, 512))


def _prefill_graph_tokens(chunk: int) -> list[int]:
    """Token counts SGLang captures prefill graphs for, up to the chunk (cuda_graph_hook.py
    ``generate_prefill_cuda_graph_batch_sizes``)."""
    sizes = ([*range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(576, 1025, 64),
              *range(1280, 4097, 256), *range(4608, chunk + 1, 512)])
    return [n for n in sizes if n <= chunk]


def _tgi_v3(engine: EngineProfile, model: ModelSpec, plan: ServePlan, pool: Pool,
            work: Workload) -> EngineProfile:
    """TGI 3's ``max_batch_prefill_tokens`` when none is given (tgi@v3.3.7 launcher/src/main.rs): the card's f16
    FLOPs times the shards over the model's FLOPs per token (``compute_optimal``, kept only above 100), else 4096;
    at most the model's positions and the tokens the memory left by the weights holds (``vram_maximum``). The
    warmup forward of that many tokens sizes the activations, and each step's prefill chunk takes that budget."""
    optimal = TGI_F16_FLOPS.get(pool.gpu.name, 0.0) * plan.tp // max(_tgi_flop_per_token(model), 1.0)
    value = int(optimal) if optimal > 100 else 4096
    if model.max_seq_len:
        value = min(value, model.max_seq_len)
    vram = _tgi_vram_tokens(engine, model, plan, pool)
    if vram is not None:
        value = min(value, vram)
    return replace(engine, max_batched_tokens=value, activation_tokens=value)


TGI_F16_FLOPS = {"h100-sxm": 900e12, "h100-nvl-94gb": 900e12, "h200": 989e12, "a100-80gb": 312e12,
                 "a100-40gb": 312e12, "a100": 312e12, "l40s": 363e12, "l4": 121e12}
"""TGI's card table (tgi@v3.3.7 launcher/src/main.rs ``ComputeType::f16_flop``) by the catalog names of the
cards its nvidia-smi name parse knows; any other card (H100 PCIe, GH200, B200, MI300X) is unknown to it: 4096."""
TGI_WIGGLE_ROOM = 0.90
"""TGI_WIGGLE_ROOM (server/text_generation_server/models/globals.py, v3.3.7): a profile's KV fraction is
--cuda-memory-fraction times it."""


TGI_LOCAL_EXPERTS_FAMILIES = frozenset({"mixtral"})
"""Model families whose config.json counts experts as ``num_local_experts``, the only key TGI reads
(tgi@v3.3.7 launcher/src/main.rs RawConfig ``#[serde(rename = "num_local_experts")]``, unwrap_or(1)): Qwen3-MoE's
``num_experts`` and DeepSeek-V3's ``n_routed_experts`` read as 1 expert."""


def _tgi_ffn(model: ModelSpec) -> tuple[int, int, int]:
    """(intermediate_size, experts per token + shared experts, experts) as TGI's ``Config`` reads config.json
    (1, 0, 1 for a dense model): ``num_experts_per_tok``, ``n_shared_experts`` and ``num_local_experts``
    (``TGI_LOCAL_EXPERTS_FAMILIES``). ``intermediate_size`` is, for a MoE model with dense first layers (DeepSeek-V3:
    first_k_dense_replace 3, intermediate_size 18432, moe_intermediate_size 2048), the dense layers' width, which
    meshplan keeps on their own block, not the experts' width."""
    layer = model.decoder
    moe = layer.moe
    if moe is None:
        return layer.ffn_hidden, 1, 1
    dense = [b.layer.ffn_hidden for b in model.blocks
             if b.layer.moe is None and b.layer.hidden == layer.hidden and b.layer.attention == layer.attention]
    experts = moe.n_experts if model.family in TGI_LOCAL_EXPERTS_FAMILIES else 1
    return (dense[0] if dense else layer.ffn_hidden), moe.top_k + moe.n_shared_experts, experts


def _tgi_head_dim(model: ModelSpec) -> int:
    """TGI's ``get_head_dim``: config.json's ``head_dim``, else hidden / heads (tgi@v3.3.7 launcher/src/main.rs
    ``From<RawConfig>``). MLA configs carry no ``head_dim`` (DeepSeek-V3: qk_nope_head_dim 128, v_head_dim 128), so
    TGI reads 7168 / 128 = 56 there; elsewhere the catalog's head_dim is the config's."""
    att = model.decoder.attention
    return model.decoder.hidden // att.n_heads if att.kind == "mla" else att.head_dim


def _tgi_flop_per_token(model: ModelSpec) -> float:
    """TGI's ``Config::flop``: per layer 2 x (3 heads + 2 kv heads) x head_dim x hidden for attention (q, o and
    the scores counted as one each) plus 6 x hidden x intermediate x (experts per token + shared experts)."""
    layer = model.decoder
    att = layer.attention
    ffn, active, _ = _tgi_ffn(model)
    attn = 2 * (3 * att.n_heads + 2 * att.n_kv_heads) * _tgi_head_dim(model) * layer.hidden
    return float((attn + 6 * layer.hidden * ffn * active) * model.n_layers)


def _tgi_vram_tokens(engine: EngineProfile, model: ModelSpec, plan: ServePlan, pool: Pool) -> int | None:
    """TGI's ``vram_maximum``: 0.95 x the shards' memory x --cuda-memory-fraction, less the 16-bit weights, over
    the bytes a token takes; None when the checkpoint is quantized (its config's ``quantize``: int4's AWQ/GPTQ;
    fp8 is quantized on load from a 16-bit checkpoint, which keeps the rule) or the weights leave nothing."""
    if plan.precision in ("int4", "fp4"):
        return None
    layer = model.decoder
    att = layer.attention
    ffn, _, experts = _tgi_ffn(model)
    fraction = min(engine.kv_memory_fraction / TGI_WIGGLE_ROOM, 1.0)
    avail = 0.95 * pool.gpu.hbm_bytes * plan.tp * fraction  # nvidia-smi's total: CUDA's, 0.6 % below, here
    # model_vram: (heads + 2 kv heads) x head_dim + heads x head_dim x hidden + 3 x ffn x experts x hidden per
    # layer, plus two vocab tables, in 16 bits
    hd = _tgi_head_dim(model)
    params = ((att.n_heads + 2 * att.n_kv_heads) * hd + att.n_heads * hd * layer.hidden
              + 3 * ffn * experts * layer.hidden) * model.n_layers + 2 * layer.hidden * model.vocab
    # token_vram: 16-bit K and V of every layer plus (ffn + ffn / 2) x experts x 2 B x 3 of MLP intermediates
    per_token = att.n_kv_heads * 2 * hd * 2 * model.n_layers + (ffn + ffn // 2) * experts * 2 * 3
    left = avail - 2 * params
    return int(left // per_token) if left > 0 else None


def _lmdeploy(engine: EngineProfile, model: ModelSpec, plan: ServePlan, pool: Pool,
              work: Workload) -> EngineProfile:
    """LMDeploy's ``max_batch_size`` by card (lmdeploy@v0.16.0 lmdeploy/utils.py ``get_max_batch_size``: 1024 on
    H100/H800/H200, 384 on A100/A800, else 128) and TurboMind's forward budget of ``max_prefill_token_num`` plus
    that batch (src/turbomind/turbomind.cc); never above the profile's own cap."""
    name = pool.gpu.name
    batch = next((n for keys, n in LMDEPLOY_BATCH if any(k in name for k in keys)), 128)
    return with_cap(engine, min(batch, engine.max_num_seqs))


LMDEPLOY_BATCH = ((("h100", "h800", "h200"), 1024), (("a100", "a800"), 384))
"""``get_max_batch_size``'s device-name keys (a substring of the card's name: GH200 reads as H200)."""


def _round_up(x: float, rungs: tuple[tuple[float, int], ...], least: int) -> int:
    """``x`` rounded up to the step of the first rung whose limit it is below, at least ``least`` (finetune_setting's
    ladders: batch to 32 below 256, 128 below 1024, else 256, at least 64; tokens to 256 below 4096, 512 below
    8192, else 1024, at least 2048)."""
    step = next(step for limit, step in rungs if x < limit)
    return max(least, step * math.ceil(x / step))


SIZINGS = {"none": lambda engine, model, plan, pool, work: engine, "trtllm-bench": _trtllm_bench,
           "trtllm-bench-pytorch": _trtllm_bench_pytorch,
           "vllm-v0": _vllm_v0, "vllm-v1": _vllm_v1, "sglang": _sglang, "tgi-v3": _tgi_v3,
           "lmdeploy": _lmdeploy}
"""Build-sizing rule -> the engine with its caps for one workload and layout (``spec.engine.BUILD_SIZINGS``)."""


def with_cap(engine: EngineProfile, seqs: int) -> EngineProfile:
    """The engine with a running-sequence cap the search tries or the user pins; where the step budget follows the
    batch (TurboMind's max_prefill_token_num + max_batch_size, src/turbomind/turbomind.cc) it follows the cap."""
    out = replace(engine, max_num_seqs=seqs)
    if engine.build_sizing == "lmdeploy":
        out = replace(out, max_batched_tokens=engine.activation_tokens + seqs)
    return out


def sized_engine(engine: EngineProfile, model: ModelSpec, plan: ServePlan, pool: Pool,
                 work: Workload) -> EngineProfile:
    """The engine as its benchmark builds it for ``work`` on ``plan`` (the profile itself when it has no rule)."""
    return SIZINGS[engine.build_sizing](engine, model, plan, pool, work)
