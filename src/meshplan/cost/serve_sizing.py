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
    gpus = plan.tp * plan.pp
    # calc_engine_setting: byte_per_token = 2 x attention layers x max(tp, n_kv) x head_size x KV element bytes
    # (all ranks together), which is this model's KV per GPU times the replica's GPUs.
    per_token = kv_bytes_per_token_per_gpu(model, plan) * gpus
    engine_bytes = model_params(model) * plan.weight_bytes  # param_count x bytes per element
    # kv_cache_gpu_mem_fraction = 0.95 of the rest; the tool reads NVML's total (utils.get_device_memory), about
    # 0.6 % above the CUDA-visible memory the catalog holds
    cache = 0.95 * (pool.gpu.hbm_bytes * gpus - engine_bytes)
    requests = max(cache / (per_token * (work.input_len + work.output_len)), 1.0)
    # finetune_setting: the batch capped at 4096 over pp, tokens at batch x (1 + ISL/OSL) capped at 32768
    raw_bs = min(requests, 4096) / plan.pp
    raw_tokens = min(raw_bs * (1 + work.input_len / work.output_len), 32768)
    bs = _round_up(raw_bs, ((256, 32), (1024, 128), (math.inf, 256)), least=64)
    tokens = _round_up(raw_tokens, ((4096, 256), (8192, 512), (math.inf, 1024)), least=2048)
    return replace(engine, max_num_seqs=bs, max_batched_tokens=tokens, activation_tokens=tokens)


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


def _round_up(x: float, rungs: tuple[tuple[float, int], ...], least: int) -> int:
    """``x`` rounded up to the step of the first rung whose limit it is below, at least ``least`` (finetune_setting's
    ladders: batch to 32 below 256, 128 below 1024, else 256, at least 64; tokens to 256 below 4096, 512 below
    8192, else 1024, at least 2048)."""
    step = next(step for limit, step in rungs if x < limit)
    return max(least, step * math.ceil(x / step))


SIZINGS = {"none": lambda engine, model, plan, pool, work: engine, "trtllm-bench": _trtllm_bench,
           "vllm-v0": _vllm_v0}
"""Build-sizing rule -> the engine with its caps for one workload and layout (``spec.engine.BUILD_SIZINGS``)."""


def sized_engine(engine: EngineProfile, model: ModelSpec, plan: ServePlan, pool: Pool,
                 work: Workload) -> EngineProfile:
    """The engine as its benchmark builds it for ``work`` on ``plan`` (the profile itself when it has no rule)."""
    return SIZINGS[engine.build_sizing](engine, model, plan, pool, work)
