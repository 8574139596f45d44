"""The serving model's fitted constants: HBM efficiency of decode steps (weight reads, KV-cache reads), the
prefill attention's and the GEMMs' share of peak per GPU generation, and host time per engine step and per
sequence in a step per engine family, in ``serve_constants.toml`` (written by ``scripts/fit_serving.py``, never
by hand)."""

from __future__ import annotations

import tomllib
from functools import lru_cache
from importlib import resources

FILE = "serve_constants.toml"
TABLES = ("decode_mem_eff", "decode_kv_eff", "prefill_attn_eff", "engine_gemm_eff", "step_host_s",
          "seq_host_s", "allreduce_s", "request_s")
"""decode_mem_eff (weights and activations), decode_kv_eff (the KV cache a decode step's attention streams),
prefill_attn_eff and engine_gemm_eff (share of the dtype's peak an engine's GEMMs reach), allreduce_s (time per TP
all-reduce beyond its link's latency and bandwidth): by GPU generation;
step_host_s, seq_host_s (per running sequence) and request_s: by engine profile name or family."""


@lru_cache(maxsize=1)
def load_constants() -> dict:
    """Each of TABLES as a dict; empty tables mean the training calibration's ``mem_eff`` and no host time."""
    text = resources.files("meshplan.calibrate").joinpath(FILE).read_text()
    data = tomllib.loads(text)
    return {k: dict(data.get(k, {})) for k in TABLES}
