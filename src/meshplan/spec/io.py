"""One strict loader: TOML/JSON files and dicts into frozen specs. Unknown keys are errors with close matches.

File units are the datasheet's (GB, TB/s, GB/s bidirectional NVLink, Gb/s NIC, TFLOP/s); specs hold SI units.
"""

from __future__ import annotations

import json
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
from meshplan.spec.plan import Plan


def read_file(path: str | Path) -> dict:
    """Parse a TOML or JSON file into a dict, with a one-line error naming the file on failure."""
    p = Path(path)
    if p.is_dir():
        raise SpecError("file", str(p), "is a folder; give a TOML or JSON file")
    if not p.is_file():
        raise SpecError("file", str(p), "no such file")
    try:
        text = p.read_text()
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
    kw = {}
    for k, v in data.items():
        if k in nested:
            kw[k] = nested[k](v, f"{where}.{k}")
        elif isinstance(v, list):
            kw[k] = tuple(v)
        else:
            kw[k] = v
    try:
        return cls(**kw)
    except TypeError as exc:
        raise SpecError(where, data, f"cannot be built: {exc}") from None


# ---------------------------------------------------------------- GPUs
_GPU_KEYS = {"name", "generation", "peak_tflops", "hbm_gb", "hbm_tb_s", "nvlink_gb_s", "nic_gbit_s",
             "nvlink_domain", "gpus_per_node", "intra_latency_us", "nic_latency_us", "price_per_hour", "source",
             "calibration", "usable_gib", "usable_source"}


def gpu_from_dict(d: dict, where: str = "gpu") -> GPUSpec:
    """A GPU from datasheet units: TFLOP/s, GB, TB/s, bidirectional NVLink GB/s, NIC Gb/s. Device memory is the
    measured CUDA-visible total (``usable_gib``, what ``torch.cuda.get_device_properties().total_memory`` reports)
    where the file gives one, else the datasheet's ``hbm_gb`` read as decimal GB (an under-estimate: NVIDIA's
    "80 GB" is 80 GiB of HBM, of which CUDA sees about 79.1 GiB)."""
    check_keys(where, d, _GPU_KEYS, ("name", "generation", "peak_tflops", "hbm_gb", "hbm_tb_s", "nvlink_gb_s",
                                     "nic_gbit_s"))
    check_keys(f"{where}.peak_tflops", d["peak_tflops"], set(DTYPES))
    return GPUSpec(
        name=d["name"], generation=d["generation"],
        peak=PeakFlops(**{k: float(v) * 1e12 for k, v in d["peak_tflops"].items()}),
        hbm_bytes=_device_memory(d, where), hbm_bandwidth=float(d["hbm_tb_s"]) * 1e12,
        # Datasheets quote NVLink as the bidirectional aggregate; one direction is half.
        intra_bandwidth=float(d["nvlink_gb_s"]) * 1e9 / 2,
        nic_bandwidth=float(d["nic_gbit_s"]) * 1e9 / 8,
        nvlink_domain=int(d.get("nvlink_domain", 8)), gpus_per_node=int(d.get("gpus_per_node", 8)),
        intra_latency=float(d.get("intra_latency_us", 3.0)) * 1e-6,
        nic_latency=float(d.get("nic_latency_us", 8.0)) * 1e-6,
        price_per_hour=float(d.get("price_per_hour", 0.0)), source=d.get("source", ""),
        calibration=_calibration_pairs(d.get("calibration", {}), f"{where}.calibration"))


def _device_memory(d: dict, where: str) -> float:
    """Bytes of device memory an engine or allocator can size against (see ``gpu_from_dict``)."""
    if "usable_gib" not in d:
        return float(d["hbm_gb"]) * 1e9
    usable = float(d["usable_gib"]) * 2**30
    if not 0 < usable <= 1.1 * float(d["hbm_gb"]) * 2**30:
        raise SpecError(f"{where}.usable_gib", d["usable_gib"], f"must be positive and at most the {d['hbm_gb']} "
                        "GiB of HBM the datasheet names")
    if not d.get("usable_source"):
        raise SpecError(f"{where}.usable_source", "", "must say where the measured usable_gib comes from")
    return usable


def _calibration_pairs(d: dict, where: str) -> tuple[tuple[str, float], ...]:
    """A GPU file's measured calibration constants, checked against the known names."""
    from dataclasses import fields as dc_fields

    from meshplan.spec.calibration import Calibration

    check_keys(where, d, {f.name for f in dc_fields(Calibration)})
    return tuple(sorted((k, float(v)) for k, v in d.items()))


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


_SHORT_MODEL_KEYS = {"name", "n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "vocab", "head_dim",
                     "activation", "norm", "bias", "tied_embeddings", "position", "family", "max_seq_len", "moe",
                     "first_dense", "dense_ffn_hidden", "attention_kind", "q_lora_rank", "kv_lora_rank",
                     "qk_rope_head_dim", "v_head_dim", "qkv_bias", "qk_norm", "norm_eps", "rope_theta", "rope_scaling",
                     "rope_scaling_factor", "rope_mscale", "dropout"}


def model_from_dict(d: dict, where: str = "model") -> ModelSpec:
    """A model from either the full ``[[blocks]]`` form or the short single-decoder form."""
    if "blocks" in d:
        return build(ModelSpec, d, where, {"blocks": _blocks})
    check_keys(where, d, _SHORT_MODEL_KEYS, ("name", "n_layers", "hidden", "n_heads", "ffn_hidden", "vocab"))
    kw = dict(d)
    kw.setdefault("n_kv_heads", kw["n_heads"])
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
        if not sep or not count.isdigit() or int(count) < 1 or not name:
            raise SpecError("--gpus", text, "expected COUNTxGPU[+COUNTxGPU...][+COUNTxserver[@GB/s]], e.g. "
                            "1024xa100-80gb")
        if name.split("@")[0] == "server":
            servers, server_bw = int(count), _server_rate(name, text)
            continue
        gpu = gpu_lookup(name)
        pools.append(Pool(gpu=gpu, n_gpus=int(count), gpus_per_node=min(gpu.gpus_per_node, int(count))))
    if not pools:
        raise SpecError("--gpus", text, "names no GPUs (CPU servers serve GPU workers), e.g. 64xa100-40gb+8xserver")
    return ClusterSpec(pools=tuple(pools), name=text, servers=servers, server_bandwidth=server_bw)


def _server_rate(name: str, text: str) -> float:
    """``server`` (one NIC of the GPU's rate: 0) or ``server@GB/s``."""
    _, _, rate = name.partition("@")
    try:
        value = float(rate) if rate else 0.0
    except ValueError:
        value = -1.0
    if value < 0 or (rate and value == 0):
        raise SpecError("--gpus", text, "a server's rate is COUNTxserver@GB/s with a positive GB/s, e.g. 8xserver@12.5")
    return value * 1e9


def _level(d: dict, where: str) -> NetworkLevel:
    check_keys(where, d, {"name", "span", "bandwidth_gb_s", "latency_us"}, ("name", "span", "bandwidth_gb_s"))
    return NetworkLevel(name=d["name"], span=int(d["span"]), bandwidth=float(d["bandwidth_gb_s"]) * 1e9,
                        latency=float(d.get("latency_us", 5.0)) * 1e-6)


def cluster_from_dict(d: dict, gpu_lookup, where: str = "cluster") -> ClusterSpec:
    """A cluster file: ``[[pools]]`` with gpu (name or inline table), n_gpus, gpus_per_node, optional
    ``[[pools.levels]]`` (name, span, per-GPU unidirectional bandwidth_gb_s, latency_us) and an optional
    ``[derating]`` table: ``gpus = [[17, 0.6]]`` (GPU id, fraction of rated compute) and ``links = [[3, 0.25]]``
    (scale-up domain, fraction of rated scale-out bandwidth)."""
    check_keys(where, d, {"name", "pools", "inter_pool_gb_s", "derating", "servers"}, ("pools",))
    pools = []
    for i, p in enumerate(d["pools"]):
        w = f"{where}.pools[{i}]"
        check_keys(w, p, {"gpu", "n_gpus", "gpus_per_node", "levels"}, ("gpu", "n_gpus"))
        gpu = gpu_from_dict(p["gpu"], f"{w}.gpu") if isinstance(p["gpu"], dict) else gpu_lookup(p["gpu"])
        levels = tuple(_level(lv, f"{w}.levels[{j}]") for j, lv in enumerate(p.get("levels", [])))
        pools.append(Pool(gpu=gpu, n_gpus=int(p["n_gpus"]),
                          gpus_per_node=int(p.get("gpus_per_node", gpu.gpus_per_node)), levels=levels))
    count, bw = _servers(d.get("servers", {}), where)
    return ClusterSpec(pools=tuple(pools), name=d.get("name", ""), derating=_derating(d.get("derating", {}), where),
                       inter_pool_bandwidth=float(d.get("inter_pool_gb_s", 0.0)) * 1e9, servers=count,
                       server_bandwidth=bw)


def _servers(d: dict, where: str) -> tuple[int, float]:
    """A ``[servers]`` table: ``count`` CPU machines, each with ``bandwidth_gb_s`` of scale-out bandwidth."""
    w = f"{where}.servers"
    if not isinstance(d, dict):
        raise SpecError(w, d, "must be a table with count and optionally bandwidth_gb_s")
    check_keys(w, d, {"count", "bandwidth_gb_s"}, ())
    count, bw = d.get("count", 0), d.get("bandwidth_gb_s", 0.0)
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise SpecError(f"{w}.count", count, "must be a whole number of CPU machines >= 0")
    if not isinstance(bw, (int, float)) or bw < 0:
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
        if not isinstance(items, list) or not all(isinstance(x, list) and len(x) == 2 and isinstance(x[0], int)
                                                  and isinstance(x[1], (int, float)) for x in items):
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


# ---------------------------------------------------------------- plans
PLAN_FILE_KEYS = {"model", "gpus", "cluster", "plan", "framework", "predicted"}


def plan_from_dict(d: dict, where: str = "plan") -> Plan:
    """A plan from a flat table whose keys are Plan's fields."""
    return build(Plan, d, where)


def read_plan_file(path: str | Path) -> tuple[Plan, dict]:
    """A plan file: ``[plan]`` table plus optional ``model``, ``gpus`` or ``cluster`` references and a
    ``[framework]`` table of the stack's settings that differ from the preset ``plan.framework`` names.

    Returns the plan and the dict of references (model, gpus, cluster, framework) the file carries.
    """
    d = read_file(path)
    if "plan" not in d:
        return plan_from_dict(d, f"{path}"), {}
    check_keys(str(path), d, PLAN_FILE_KEYS, ("plan",))
    refs = {k: d[k] for k in ("model", "gpus", "cluster", "framework", "predicted") if k in d}
    if "framework" in refs and not isinstance(refs["framework"], dict):
        raise SpecError(f"{path}.framework", refs["framework"], "must be a table of stack settings, e.g. "
                        "grad_dtype = \"bf16\" (the stack's name is plan.framework)")
    return plan_from_dict(d["plan"], f"{path}.plan"), refs


def plan_file_text(plan: Plan, *, model: str = "", gpus: str = "", framework: dict | None = None,
                   predicted: dict | None = None, cluster: str = "") -> str:
    """TOML text of a plan file that read_plan_file reads back; ``framework``: the stack settings that differ
    from the preset the plan names (``FrameworkProfile.changes_from``); ``cluster``: a cluster file the plan
    runs on (its levels, derating and servers, which the ``gpus`` shorthand cannot carry)."""
    import tomli_w

    doc: dict = {}
    if model:
        doc["model"] = model
    if cluster:
        doc["cluster"] = cluster
    elif gpus:
        doc["gpus"] = gpus
    doc["plan"] = plan.to_dict()
    if framework:
        doc["framework"] = dict(framework)
    if predicted:
        doc["predicted"] = predicted
    return tomli_w.dumps(doc)
