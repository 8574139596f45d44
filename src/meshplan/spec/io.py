"""One strict loader: TOML/JSON files and dicts into frozen specs. Unknown keys are errors with close matches.

File units are the datasheet's (GB, TB/s, GB/s bidirectional NVLink, Gb/s NIC, TFLOP/s); specs hold SI units.
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import MISSING, fields, replace
from pathlib import Path
from typing import Any

from meshplan.errors import SpecError, close_matches
from meshplan.spec.cluster import ClusterSpec, Derating, NetworkLevel, Pool
from meshplan.spec.framework import FrameworkProfile
from meshplan.spec.hardware import DTYPES, GPUSpec, PeakFlops
from meshplan.spec.model import (
    AttentionSpec,
    BlockSpec,
    LayerSpec,
    ModelSpec,
    MoESpec,
    decoder_model,
)
from meshplan.spec.typed import REQUIRED, fits, typed, value_of


def existing_file(path: str | Path, kind: str) -> Path:
    """``path`` as a ``kind`` file ("TOML or JSON", "CSV") to read, or a one-line error: empty, a folder, missing,
    not a regular file."""
    if not str(path).strip():
        raise SpecError("file", str(path), f"is empty: name a {kind} file")
    p = Path(path)
    if p.is_dir():
        raise SpecError("file", str(p), f"is a folder; give a {kind} file")
    if not p.exists():
        raise SpecError("file", str(p), "no such file")
    if not p.is_file():
        raise SpecError("file", str(p), f"is not a regular file; give a {kind} file")
    return p


def read_file(path: str | Path) -> dict:
    """Parse a TOML or JSON file into a dict, with a one-line error naming the file on failure."""
    p = existing_file(path, "TOML or JSON")
    try:
        text = p.read_text(encoding="utf-8-sig")  # a byte-order mark some editors write is not content
        return json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SpecError("file", str(p), f"cannot be parsed: {exc}") from None


def check_keys(where: str, data: dict, allowed: set[str] | list[str], required: tuple[str, ...] = ()) -> None:
    """Reject unknown and missing keys, suggesting close matches."""
    if not isinstance(data, dict):
        raise SpecError(where, data, "must be a table of key = value")
    for k in data:
        if k not in allowed:
            raise SpecError(f"{where}.{k}", data[k], f"unknown key; allowed: {', '.join(sorted(allowed))}",
                            close_matches(k, allowed))
    for k in required:
        if k not in data:
            raise SpecError(f"{where}.{k}", None, "is required")


def build(cls: type, data: dict, where: str, nested: dict[str, Any] | None = None) -> Any:
    """Build dataclass ``cls`` from ``data`` strictly; ``nested`` maps field names to builders."""
    nested = nested or {}
    flds = {f.name: f for f in fields(cls)}
    required = tuple(n for n, f in flds.items() if f.default is MISSING and f.default_factory is MISSING)
    check_keys(where, data, set(flds), required)
    kw = {k: nested[k](v, f"{where}.{k}") if k in nested else _field_value(v, f"{where}.{k}", flds[k].type)
          for k, v in data.items()}
    try:
        return cls(**kw)
    except TypeError as exc:
        raise SpecError(where, data, f"cannot be built: {exc}") from None


_ANNOTATION_KINDS = {"int": "whole", "float": "num", "bool": "bool", "str": "str"}


def _field_value(v: Any, where: str, annotation: Any) -> Any:
    """A file's value for a dataclass field, checked against the field's annotation (``int``, ``float``,
    ``bool``, ``str``, ``tuple[X, ...]``); values of other fields pass unchecked (arrays as tuples)."""
    annotation = str(annotation)
    if annotation.startswith("tuple["):
        inner = _ANNOTATION_KINDS.get(annotation[6:].split(",")[0].strip())
        return tuple(typed(x, f"{where}[{i}]", inner) if inner else x
                     for i, x in enumerate(typed(v, where, "array")))
    kind = _ANNOTATION_KINDS.get(annotation)
    return typed(v, where, kind) if kind else tuple(v) if isinstance(v, list) else v


# ---------------------------------------------------------------- GPUs
_GPU_KEYS = {"name", "generation", "peak_tflops", "hbm_gb", "hbm_tb_s", "nvlink_gb_s", "nic_gbit_s",
             "nvlink_domain", "gpus_per_node", "intra_latency_us", "nic_latency_us", "price_per_hour", "source",
             "calibration", "usable_gib", "usable_source"}


def gpu_from_dict(d: dict, where: str = "gpu") -> GPUSpec:
    """A GPU from datasheet units: TFLOP/s, GB, TB/s, bidirectional NVLink GB/s, NIC Gb/s. Device memory is the
    measured CUDA-visible total (``usable_gib``, what ``torch.cuda.get_device_properties().total_memory`` reports)
    where the file gives one, else the datasheet's ``hbm_gb`` read as decimal GB (an under-estimate: NVIDIA's
    "80 GB" is 80 GiB of HBM, of which CUDA sees about 79.1 GiB)."""
    d = {k: v for k, v in d.items() if k != "aliases"} if isinstance(d, dict) else d  # catalog names, not specs
    check_keys(where, d, _GPU_KEYS, ("name", "generation", "peak_tflops", "hbm_gb", "hbm_tb_s", "nvlink_gb_s",
                                     "nic_gbit_s"))
    peaks = typed(d["peak_tflops"], f"{where}.peak_tflops", "table")
    check_keys(f"{where}.peak_tflops", peaks, set(DTYPES))
    for k, v in peaks.items():
        typed(v, f"{where}.peak_tflops.{k}", "nonneg")
    if not any(peaks.get(k, 0) > 0 for k in ("bf16", "fp32")):  # what GPUSpec needs to price any math
        key = next((k for k in ("bf16", "fp32") if k in peaks), "")
        raise SpecError(f"{where}.peak_tflops" + (f".{key}" if key else ""), peaks[key] if key else peaks,
                        "needs a positive dense bf16 or fp32 peak in TFLOP/s, e.g. bf16 = 989")

    def num(key: str, kind: str, default: Any = REQUIRED) -> float:
        return float(value_of(d, key, where, kind, default))

    return GPUSpec(
        name=value_of(d, "name", where, "str"), generation=value_of(d, "generation", where, "str"),
        peak=PeakFlops(**{k: float(typed(v, f"{where}.peak_tflops.{k}", "nonneg")) * 1e12 for k, v in peaks.items()}),
        hbm_bytes=_device_memory(d, where), hbm_bandwidth=num("hbm_tb_s", "pos") * 1e12,
        # Datasheets quote NVLink as the bidirectional aggregate; one direction is half.
        intra_bandwidth=num("nvlink_gb_s", "pos") * 1e9 / 2,
        nic_bandwidth=num("nic_gbit_s", "pos") * 1e9 / 8,
        nvlink_domain=value_of(d, "nvlink_domain", where, "int", 8),
        gpus_per_node=value_of(d, "gpus_per_node", where, "int", 8),
        intra_latency=num("intra_latency_us", "nonneg", 3.0) * 1e-6,
        nic_latency=num("nic_latency_us", "nonneg", 8.0) * 1e-6,
        price_per_hour=num("price_per_hour", "nonneg", 0.0), source=value_of(d, "source", where, "str", ""),
        calibration=_calibration_pairs(d.get("calibration", {}), f"{where}.calibration"))


def _device_memory(d: dict, where: str) -> float:
    """Bytes of device memory an engine or allocator can size against (see ``gpu_from_dict``)."""
    hbm = float(value_of(d, "hbm_gb", where, "pos"))
    if "usable_gib" not in d:
        return hbm * 1e9
    usable = float(value_of(d, "usable_gib", where, "pos")) * 2**30
    if not 0 < usable <= 1.1 * hbm * 2**30:
        raise SpecError(f"{where}.usable_gib", d["usable_gib"], f"must be positive and at most the {d['hbm_gb']} "
                        "GiB of HBM the datasheet names")
    if not value_of(d, "usable_source", where, "str", ""):
        raise SpecError(f"{where}.usable_source", "", "must say where the measured usable_gib comes from")
    return usable


def _calibration_pairs(d: dict, where: str) -> tuple[tuple[str, float], ...]:
    """A GPU file's measured calibration constants, checked against the known names."""
    from dataclasses import fields as dc_fields

    from meshplan.spec.calibration import Calibration

    check_keys(where, d, {f.name for f in dc_fields(Calibration)})
    return tuple(sorted((k, float(typed(v, f"{where}.{k}", "num"))) for k, v in d.items()))


def gpu_to_dict(g: GPUSpec) -> dict:
    """Inverse of gpu_from_dict (datasheet units)."""
    peaks = {k: getattr(g.peak, k) / 1e12 for k in DTYPES if getattr(g.peak, k)}
    return {"name": g.name, "generation": g.generation, "peak_tflops": peaks, "hbm_gb": g.hbm_bytes / 1e9,
            "hbm_tb_s": g.hbm_bandwidth / 1e12, "nvlink_gb_s": g.intra_bandwidth * 2 / 1e9,
            "nic_gbit_s": g.nic_bandwidth * 8 / 1e9, "nvlink_domain": g.nvlink_domain,
            "gpus_per_node": g.gpus_per_node, "intra_latency_us": g.intra_latency * 1e6,
            "nic_latency_us": g.nic_latency * 1e6, "price_per_hour": g.price_per_hour, "source": g.source,
            **({"calibration": dict(g.calibration)} if g.calibration else {})}


# ---------------------------------------------------------------- models
def _layer(d: dict, where: str) -> LayerSpec:
    return build(LayerSpec, d, where, {
        "attention": lambda v, w: build(AttentionSpec, v, w),
        "moe": lambda v, w: build(MoESpec, v, w)})


def _blocks(v: list, where: str) -> tuple[BlockSpec, ...]:
    if not isinstance(v, list):
        raise SpecError(where, v, "must be an array of tables [[blocks]]")
    return tuple(build(BlockSpec, b, f"{where}[{i}]", {"layer": _layer}) for i, b in enumerate(v))


_SHORT_MODEL_KEYS = {"name": "str", "n_layers": "int", "hidden": "int", "n_heads": "int", "n_kv_heads": "int",
                     "ffn_hidden": "int", "vocab": "int", "head_dim": "count", "activation": "str", "norm": "str",
                     "bias": "bool", "tied_embeddings": "bool", "position": "str", "family": "str",
                     "max_seq_len": "count", "moe": "table", "first_dense": "count", "dense_ffn_hidden": "count",
                     "attention_kind": "str", "q_lora_rank": "count", "kv_lora_rank": "count",
                     "qk_rope_head_dim": "count", "v_head_dim": "count", "qkv_bias": "bool", "qk_norm": "bool",
                     "norm_eps": "pos", "rope_theta": "pos", "rope_scaling": "str", "rope_scaling_factor": "pos",
                     "rope_mscale": "nonneg", "dropout": "num"}
"""Keys of the short single-decoder model form and the kind (``typed``) of each value."""


def model_from_dict(d: dict, where: str = "model") -> ModelSpec:
    """A model from either the full ``[[blocks]]`` form or the short single-decoder form (a catalog file's
    ``aliases``, the names it answers to, are not part of the model)."""
    d = {k: v for k, v in d.items() if k != "aliases"} if isinstance(d, dict) else d
    if "blocks" in d:
        return build(ModelSpec, d, where, {"blocks": _blocks})
    check_keys(where, d, set(_SHORT_MODEL_KEYS), ("name", "n_layers", "hidden", "n_heads", "ffn_hidden", "vocab"))
    kw = {k: typed(v, f"{where}.{k}", _SHORT_MODEL_KEYS[k]) for k, v in d.items()}
    kw.setdefault("n_kv_heads", kw["n_heads"])
    if not kw.get("head_dim") and kw["n_heads"] and kw["hidden"] % kw["n_heads"]:  # no head width to floor silently
        raise SpecError(f"{where}.hidden", kw["hidden"], f"must be a multiple of n_heads = {kw['n_heads']} (or "
                        "give head_dim)")
    if "moe" in kw:
        kw["moe"] = build(MoESpec, kw["moe"], f"{where}.moe")
    return decoder_model(**kw)


# ---------------------------------------------------------------- clusters
def parse_gpus(text: str, gpu_lookup) -> ClusterSpec:
    """Shorthand ``1024xa100-80gb`` or ``32xa100-80gb+32xh100-sxm``; ``gpu_lookup(name)`` resolves names or
    hardware-profile paths."""
    pools, servers, server_bw = [], 0, 0.0
    for part in text.split("+"):
        count, sep, name = part.strip().partition("x")
        if not sep or not (count.isascii() and count.isdigit()) or not count.strip("0") or not name:
            raise SpecError("--gpus", text, "expected COUNTxGPU[+COUNTxGPU...][+COUNTxserver[@GB/s]], e.g. "
                            "1024xa100-80gb")
        _check_count("--gpus", text, count, "CPU servers" if name.split("@")[0] == "server" else "GPUs")
        if name.split("@")[0] == "server":
            if servers:
                raise SpecError("--gpus", text, "names servers twice; give one COUNTxserver[@GB/s] part")
            servers, server_bw = int(count), _server_rate(name, text)
            continue
        gpu = gpu_lookup(name)
        pools.append(Pool(gpu=gpu, n_gpus=int(count), gpus_per_node=min(gpu.gpus_per_node, int(count))))
    if not pools:
        raise SpecError("--gpus", text, "names no GPUs (CPU servers serve GPU workers), e.g. 64xa100-40gb+8xserver")
    return ClusterSpec(pools=tuple(pools), name=text, servers=servers, server_bandwidth=server_bw)


MAX_POOL_GPUS = 1_000_000
"""The most GPUs (or CPU servers) one pool of a cluster may hold: far beyond any machine built, and small enough
that the search and the replanner's per-GPU tables stay within memory."""


def _check_count(field: str, text: object, count: str | int, what: str = "GPUs") -> None:
    """A pool's count (the shorthand's digits, or a file's whole number) is at most MAX_POOL_GPUS."""
    if isinstance(count, str):  # digits: int() of thousands of them is refused by Python itself
        digits = count.lstrip("0")
        n = int(digits) if len(digits) <= 40 else None
    else:
        n = count if count < 10**40 else None
    if n is not None and n <= MAX_POOL_GPUS:
        return
    size = f"{n:,}" if n is not None else "more than 10^40"
    raise SpecError(field, text, f"{size} {what} cannot all be used: meshplan models at most {MAX_POOL_GPUS:,} "
                    f"{what} per pool")


def _server_rate(name: str, text: str) -> float:
    """``server`` (one NIC of the GPU's rate: 0) or ``server@GB/s``."""
    _, at, rate = name.partition("@")
    if not at:
        return 0.0
    try:
        value = float(rate)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise SpecError("--gpus", text, "a server's rate is COUNTxserver@GB/s with a positive GB/s, e.g. 8xserver@12.5")
    return value * 1e9


def _level(d: dict, where: str) -> NetworkLevel:
    check_keys(where, d, {"name", "span", "bandwidth_gb_s", "latency_us"}, ("name", "span", "bandwidth_gb_s"))
    return NetworkLevel(name=value_of(d, "name", where, "str"), span=value_of(d, "span", where, "int"),
                        bandwidth=float(value_of(d, "bandwidth_gb_s", where, "pos")) * 1e9,
                        latency=float(value_of(d, "latency_us", where, "nonneg", 5.0)) * 1e-6)


def _pool(p: dict, where: str, gpu_lookup) -> Pool:
    """One ``[[pools]]`` entry of a cluster file (see ``cluster_from_dict``)."""
    check_keys(where, p, {"gpu", "n_gpus", "gpus_per_node", "levels"}, ("gpu", "n_gpus"))
    ref = p["gpu"]
    if isinstance(ref, dict):
        gpu = gpu_from_dict(ref, f"{where}.gpu")
    elif isinstance(ref, str) and ref:
        gpu = gpu_lookup(ref)
    else:
        raise SpecError(f"{where}.gpu", ref, 'must be a GPU name (e.g. "h100-sxm"), a GPU profile file or an '
                        "inline [pools.gpu] table")
    n = value_of(p, "n_gpus", where, "int")
    _check_count(f"{where}.n_gpus", n, n)
    per_node = value_of(p, "gpus_per_node", where, "int", gpu.gpus_per_node)
    if "gpus_per_node" in p and n % per_node:
        raise SpecError(f"{where}.gpus_per_node", per_node, f"must divide n_gpus = {n}: a pool is whole nodes")
    levels = value_of(p, "levels", where, "array", [])
    return Pool(gpu=gpu, n_gpus=n, gpus_per_node=per_node,
                levels=tuple(_level(lv, f"{where}.levels[{j}]") for j, lv in enumerate(levels)))


def cluster_from_dict(d: dict, gpu_lookup, where: str = "cluster") -> ClusterSpec:
    """A cluster file: ``[[pools]]`` with gpu (name or inline table), n_gpus, gpus_per_node, optional
    ``[[pools.levels]]`` (name, span, per-GPU unidirectional bandwidth_gb_s, latency_us) and an optional
    ``[derating]`` table: ``gpus = [[17, 0.6]]`` (GPU id, fraction of rated compute) and ``links = [[3, 0.25]]``
    (scale-up domain, fraction of rated scale-out bandwidth)."""
    check_keys(where, d, {"name", "pools", "inter_pool_gb_s", "derating", "servers"}, ("pools",))
    pools = value_of(d, "pools", where, "array")
    pools = tuple(_pool(p, f"{where}.pools[{i}]", gpu_lookup) for i, p in enumerate(pools))
    count, bw = _servers(d.get("servers", {}), where)
    return ClusterSpec(pools=pools, name=value_of(d, "name", where, "str", ""),
                       derating=_derating(d.get("derating", {}), where),
                       inter_pool_bandwidth=float(value_of(d, "inter_pool_gb_s", where, "nonneg", 0.0)) * 1e9,
                       servers=count, server_bandwidth=bw)


def _servers(d: dict, where: str) -> tuple[int, float]:
    """A ``[servers]`` table: ``count`` CPU machines, each with ``bandwidth_gb_s`` of scale-out bandwidth."""
    w = f"{where}.servers"
    if not isinstance(d, dict):
        raise SpecError(w, d, "must be a table with count and optionally bandwidth_gb_s")
    check_keys(w, d, {"count", "bandwidth_gb_s"}, ())
    count, bw = d.get("count", 0), d.get("bandwidth_gb_s", 0.0)
    if not fits(count, "count"):
        raise SpecError(f"{w}.count", count, "must be a whole number of CPU machines >= 0")
    _check_count(f"{w}.count", count, count, "CPU servers")
    if not fits(bw, "nonneg"):
        raise SpecError(f"{w}.bandwidth_gb_s", bw, "must be a bandwidth in GB/s >= 0 (0 = one NIC of the GPU's rate)")
    return count, float(bw) * 1e9


def _derating(d: dict, where: str) -> Derating:
    w = f"{where}.derating"
    if not isinstance(d, dict):
        raise SpecError(w, d, "must be a table with gpus and/or links")
    check_keys(w, d, {"gpus", "links"}, ())
    out = {}
    for key in ("gpus", "links"):
        items = d.get(key, [])
        if not isinstance(items, list) or not all(isinstance(x, list) and len(x) == 2 and fits(x[0], "whole")
                                                  and fits(x[1], "num") for x in items):
            raise SpecError(f"{w}.{key}", items, "must be a list of [id, fraction] pairs, e.g. [[17, 0.6]]")
        out[key] = tuple((int(i), float(f)) for i, f in items)
    return Derating(**out)


# ---------------------------------------------------------------- software stacks
def framework_from_dict(d: dict, where: str = "framework") -> FrameworkProfile:
    """A stack profile from a catalog file: its fields plus a ``[sources]`` table citing each value."""
    data = dict(d)
    sources = data.pop("sources", {})
    known = {f.name for f in fields(FrameworkProfile)}
    if not isinstance(sources, dict) or not all(isinstance(v, str) for v in sources.values()):
        raise SpecError(f"{where}.sources", sources, "must be a table of field = citation")
    bad = sorted(set(sources) - known)
    if bad:
        raise SpecError(f"{where}.sources", bad, "must cite fields of the profile", close_matches(bad[0], known))
    return replace(build(FrameworkProfile, data, where), sources=dict(sources))
