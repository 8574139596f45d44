"""The serving model's fitted constants: HBM efficiency of decode steps and the prefill attention's share of peak
per GPU generation, and host time per
engine step per engine family, in ``serve_constants.toml`` (written by ``scripts/fit_serving.py``, never by
hand)."""

from __future__ import annotations

import tomllib
from functools import lru_cache
from importlib import resources

FILE = "serve_constants.toml"
TABLES = ("decode_mem_eff", "prefill_attn_eff", "step_host_s", "request_s")
"""decode_mem_eff and prefill_attn_eff: by GPU generation; step_host_s and request_s: by engine profile name or
family."""


@lru_cache(maxsize=1)
def load_constants() -> dict:
    """Each of TABLES as a dict; empty tables mean the training calibration's ``mem_eff`` and no host time."""
    text = resources.files("meshplan.calibrate").joinpath(FILE).read_text()
    data = tomllib.loads(text)
    return {k: dict(data.get(k, {})) for k in TABLES}
