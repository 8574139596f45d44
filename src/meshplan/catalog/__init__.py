"""Catalogs: data files plus a name registry. Adding a GPU, a model or a software-stack profile is adding one TOML
file here.

Lookups accept a catalog name or a path to a file (a model TOML/JSON, a Hugging Face ``config.json``, or a
GPU/hardware profile TOML written by ``meshplan calibrate``).
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path

from meshplan.errors import SpecError, unknown_name
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.engine import EngineProfile, engine_from_dict
from meshplan.spec.framework import FrameworkProfile
from meshplan.spec.hardware import GPUSpec
from meshplan.spec.io import (
    check_keys,
    cluster_from_dict,
    framework_from_dict,
    gpu_from_dict,
    model_from_dict,
    parse_gpus,
    read_file,
)
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import DEFAULT_FRAMEWORK
from meshplan.spec.recipe import Recipe


def _entries(kind: str) -> dict[str, str]:
    folder = resources.files("meshplan.catalog").joinpath(kind)
    return {p.name[:-5]: p.read_text() for p in folder.iterdir() if p.name.endswith(".toml")}


@lru_cache(maxsize=None)
def _catalog(kind: str) -> dict[str, dict]:
    import tomllib

    return {name: tomllib.loads(text) for name, text in _entries(kind).items()}


def gpu_names() -> list[str]:
    """Names of every GPU in the catalog."""
    return sorted(_catalog("gpus"))


def model_names() -> list[str]:
    """Names of every model in the catalog."""
    return sorted(_catalog("models"))


def _looks_like_path(ref: str) -> bool:
    return ref.endswith((".toml", ".json")) or "/" in ref


def _entry(kind: str, label: str, ref: str) -> dict:
    """The catalog entry ``ref`` of ``kind``, or a one-line error naming the close matches."""
    cat = _catalog(kind)
    if ref not in cat:
        raise unknown_name(label, ref, cat)
    return cat[ref]


@lru_cache(maxsize=256)
def gpu(ref: str) -> GPUSpec:
    """A GPU by catalog name, or from a hardware-profile TOML file."""
    if _looks_like_path(ref):
        return gpu_from_dict(read_file(ref), ref)
    return gpu_from_dict(_entry("gpus", "gpu", ref), f"gpu[{ref}]")


def model(ref: str) -> ModelSpec:
    """A model by catalog name, from a meshplan model file, or from a Hugging Face ``config.json``."""
    if _looks_like_path(ref):
        data = read_file(ref)
        if "model_type" in data or "architectures" in data:
            from meshplan.spec.hf import model_from_hf

            return model_from_hf(data, name=hf_model_name(ref, data))
        return model_from_dict(data, ref)
    return model_from_dict(_entry("models", "model", ref), f"model[{ref}]")


def hf_model_name(ref: str, data: dict) -> str:
    """The name of a model read from a Hugging Face config: the file's stem (``llama3-8b.json``), or for a file
    called ``config.json`` the repository in ``_name_or_path``, else ``architectures[0]``, never the folder (a
    download cache or a temporary directory)."""
    stem = Path(ref).stem
    if stem != "config":
        return stem
    repo = str(data.get("_name_or_path") or "").rstrip("/").rsplit("/", 1)[-1]
    archs = data.get("architectures") or []
    return repo or (str(archs[0]) if archs else "") or str(data.get("model_type") or stem)


def engine_names() -> list[str]:
    """Names of every serving-engine profile in the catalog."""
    return sorted(_catalog("engines"))


@lru_cache(maxsize=64)
def engine(ref: str) -> EngineProfile:
    """A serving-engine profile by catalog name (``vllm``, ``sglang``, ``trtllm``, or a pinned version such as
    ``vllm-0.6.0``)."""
    return engine_from_dict(_entry("engines", "engine", ref), f"engine[{ref}]")


def cluster(ref: str) -> ClusterSpec:
    """A cluster from the shorthand ``1024xa100-80gb[+...]`` or from a cluster TOML/JSON file."""
    if Path(ref).is_file():
        return cluster_from_dict(read_file(ref), gpu, ref)
    return parse_gpus(ref, gpu)


def framework_names() -> list[str]:
    """Names of every software-stack profile in the catalog."""
    return sorted(_catalog("frameworks"))


@lru_cache(maxsize=64)
def framework(ref: str) -> FrameworkProfile:
    """A software-stack profile by catalog name (``megatron-core``, ``torchtitan``, ``meshplan``...) or from a
    profile TOML file."""
    if _looks_like_path(ref):
        return framework_from_dict(read_file(ref), ref)
    return framework_from_dict(_entry("frameworks", "framework", ref), f"framework[{ref}]")


def framework_with(name: str, settings: dict | None = None) -> FrameworkProfile:
    """The preset ``name`` with ``settings`` (a plan file's ``[framework]`` table) applied."""
    profile = framework(name)
    return profile.with_(**settings) if settings else profile


def framework_for(stack: str, version: str = "") -> tuple[FrameworkProfile, str]:
    """The profile of a stack as a source names it (the validation CSV's ``framework`` and ``framework_version``):
    the preset whose ``versions`` prefix the version, else the stack's default preset, else the catalog default.
    Returns the profile and a note saying how it was chosen."""
    stack, version = stack.strip().lower(), version.strip().lower()
    presets = [framework(n) for n in framework_names()]
    mine = [p for p in presets if stack in p.stacks]
    if version:
        by_version = [p for p in mine if any(version.startswith(v.lower()) for v in p.versions)]
        if by_version:
            return by_version[0], f"{stack} {version}: {by_version[0].name}"
    default = [p for p in mine if p.default]
    if default:
        return default[0], f"{stack} {version or '(no version)'}: {default[0].name} (the stack's default)"
    fallback = framework(DEFAULT_FRAMEWORK)
    return fallback, f"{stack or '(no stack)'}: no profile, took {fallback.name}"


@lru_cache(maxsize=1)
def recipes() -> tuple[Recipe, ...]:
    """Every framework recipe in the catalog (``catalog/recipes/*.toml``), by name."""
    out = []
    for name, d in sorted(_catalog("recipes").items()):
        check_keys(f"recipe[{name}]", d, {"name", "source", "match", "sets"}, ("source", "sets"))
        if d.get("name", name) != name:
            raise SpecError(f"recipe[{name}].name", d["name"], f"must equal the file's stem {name!r}")
        out.append(Recipe(name=name, source=d["source"], match=dict(d.get("match", {})), sets=dict(d["sets"])))
    return tuple(out)
