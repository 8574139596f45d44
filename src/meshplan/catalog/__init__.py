"""Catalogs: data files plus a name registry. Adding a GPU or a model is adding one TOML file here.

Lookups accept a catalog name or a path to a file (a model TOML/JSON, a Hugging Face ``config.json``, or a
GPU/hardware profile TOML written by ``meshplan calibrate``).
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path

from meshplan.errors import unknown_name
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.hardware import GPUSpec
from meshplan.spec.io import cluster_from_dict, gpu_from_dict, model_from_dict, parse_gpus, read_file
from meshplan.spec.model import ModelSpec


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


@lru_cache(maxsize=256)
def gpu(ref: str) -> GPUSpec:
    """A GPU by catalog name, or from a hardware-profile TOML file."""
    if _looks_like_path(ref):
        return gpu_from_dict(read_file(ref), ref)
    cat = _catalog("gpus")
    if ref not in cat:
        raise unknown_name("gpu", ref, cat)
    return gpu_from_dict(cat[ref], f"gpu[{ref}]")


def model(ref: str) -> ModelSpec:
    """A model by catalog name, from a meshplan model file, or from a Hugging Face ``config.json``."""
    if _looks_like_path(ref):
        data = read_file(ref)
        if "model_type" in data or "architectures" in data:
            from meshplan.spec.hf import model_from_hf

            return model_from_hf(data, name=Path(ref).parent.name or Path(ref).stem)
        return model_from_dict(data, ref)
    cat = _catalog("models")
    if ref not in cat:
        raise unknown_name("model", ref, cat)
    return model_from_dict(cat[ref], f"model[{ref}]")


def cluster(ref: str) -> ClusterSpec:
    """A cluster from the shorthand ``1024xa100-80gb[+...]`` or from a cluster TOML/JSON file."""
    if Path(ref).is_file():
        return cluster_from_dict(read_file(ref), gpu, ref)
    return parse_gpus(ref, gpu)
