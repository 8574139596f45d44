"""Catalogs: data files plus a name registry. Adding a GPU, a model or a software-stack profile is adding one TOML
file here.

Lookups accept a catalog name or a path to a file (a model TOML/JSON, a Hugging Face ``config.json``, or a
GPU/hardware profile TOML written by ``meshplan calibrate``).
"""

from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources
from pathlib import Path

from meshplan.catalog.names import alias_index, catalog_key
from meshplan.errors import SpecError, close_matches, unknown_name
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.engine import FAMILY_NAMES, STACK_NAMES, EngineProfile, engine_from_dict, version_tuple
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
from meshplan.spec.serving import Dataset, dataset_from_dict


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


ALIASED = ("gpus", "models")
"""Catalogs whose entries answer to aliases and sources' spellings (``catalog.names``)."""


@lru_cache(maxsize=None)
def _aliases(kind: str) -> dict[str, str]:
    return alias_index(kind, _catalog(kind))


def _looks_like_path(ref: str) -> bool:
    return ref.endswith((".toml", ".json")) or "/" in ref


def _entry(kind: str, label: str, ref: str) -> dict:
    """The catalog entry ``ref`` of ``kind``, or a one-line error naming the close matches."""
    cat = _catalog(kind)
    if ref not in cat and ref.strip().lower() in cat:  # names are lower case: "H100-SXM" is h100-sxm
        ref = ref.strip().lower()
    if ref not in cat and kind in ALIASED:  # "meta-llama/Llama-3.3-70B-Instruct", "H100 SXM5"
        ref = _aliases(kind).get(catalog_key(kind, ref), ref)
    if ref not in cat:
        err = unknown_name(label, ref, cat)
        raise SpecError(label, ref, err.expected, _close(kind, ref) if kind in ALIASED else err.suggestions)
    return {k: v for k, v in cat[ref].items() if k != "aliases"}


def _close(kind: str, ref: str) -> tuple[str, ...]:
    """Catalog names close to what ``ref`` means (its key: ``Llama-3.2-3B-Instruct`` is near llama3.2-1b)."""
    return tuple(close_matches(catalog_key(kind, ref), sorted(_catalog(kind))))


def resolve(kind: str, ref: str) -> str | None:
    """The catalog name ``ref`` means in ``kind`` (``gpus``, ``models``): itself, an alias, or a source's spelling
    of either (``catalog.names``); None when it names no entry."""
    cat = _catalog(kind)
    if ref in cat:
        return ref
    return _aliases(kind).get(catalog_key(kind, ref)) if kind in ALIASED else None


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
"""A Hugging Face repository id, ``organisation/name`` (one slash, not a path that starts with / . or ~)."""
FILE_KINDS = {"models": "its config.json (Hugging Face) or of a model TOML", "gpus": "a hardware-profile TOML"}


def _named_file(kind: str, label: str, ref: str) -> bool:
    """Whether a model or GPU reference is a file: a name ending in .toml or .json, or a path (with a slash); a
    name without one is a catalog entry even where a folder of that name exists. A Hugging Face id
    (``meta-llama/Llama-3.1-8B``) that is no file is looked up in the catalog, and one it lacks is refused with
    the close names and how to give its config."""
    if ref.endswith((".toml", ".json")):
        return True
    if "/" not in ref:
        return False
    if not HUB_ID.fullmatch(ref) or _exists(ref):
        return True  # a path: read (or refused as missing) as the file it names
    if resolve(kind, ref) is None:
        raise SpecError(label, ref, f"is neither a file nor a catalog {label} (nor an alias of one); pass the path "
                        f"of {FILE_KINDS[kind]}", _close(kind, ref))
    return False


@lru_cache(maxsize=256)
def gpu(ref: str) -> GPUSpec:
    """A GPU by catalog name or alias, or from a hardware-profile TOML file."""
    if _named_file("gpus", "gpu", ref):
        return gpu_from_dict(read_file(ref), ref)
    return gpu_from_dict(_entry("gpus", "gpu", ref), f"gpu[{ref}]")


def model(ref: str) -> ModelSpec:
    """A model by catalog name or alias (a Hugging Face id of a catalog architecture), from a meshplan model
    file, or from a Hugging Face ``config.json``."""
    if _named_file("models", "model", ref):
        data = read_file(ref)
        if not isinstance(data, dict):
            raise SpecError(ref, data, "must be a table of key = value (a model file or a Hugging Face config.json)")
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
    archs = data.get("architectures")
    return repo or (str(archs[0]) if isinstance(archs, list) and archs else "") or str(data.get("model_type") or stem)


def engine_names() -> list[str]:
    """Names of every serving-engine profile in the catalog."""
    return sorted(_catalog("engines"))


@lru_cache(maxsize=64)
def engine(ref: str) -> EngineProfile:
    """A serving-engine profile by catalog name (``vllm``, ``sglang``, ``trtllm``, ``tgi``, ``lmdeploy``,
    ``fastgen``, or a pinned version such as ``vllm-0.6.0``)."""
    return engine_from_dict(_entry("engines", "engine", ref), f"engine[{ref}]")


def engine_for(text: str) -> tuple[EngineProfile, str]:
    """The profile of an engine as a source names it (a serving row's ``framework``): a profile whose ``matches``
    prefixes the text (that source's own setup), else one whose ``mentions`` the text all contains at or after its
    ``since`` (a benchmark tool), else the family's release profile (not a ``harness``) nearest the version the
    text names (``_nearest_release``). Returns the profile and a note saying how it was chosen."""
    text = text.strip()
    profiles = [engine(n) for n in engine_names()]
    for prof in profiles:
        if any(text.lower().startswith(m.lower()) for m in prof.matches):
            return prof, f"{text}: {prof.name} (its source's setup)"
    low = text.lower()
    found = [(low.find(n), fam, n) for fam, names in FAMILY_NAMES.items() for n in names if n in low]
    if not found:
        raise SpecError("framework", text, f"names no engine family ({', '.join(FAMILY_NAMES)}) and matches no "
                        "profile's `matches` (catalog/engines)")
    engines = [f for f in found if f[2] not in STACK_NAMES]  # the engine's own name, where the text gives it
    at, family, name = min(engines or found)
    named = re.search(r"\d+(?:\.\d+)+", low[at + len(name):]) if engines else None
    wanted = version_tuple(named.group(0)) if named else ()
    tools = [p for p in profiles if p.engine == family and p.mentions and all(m.lower() in low for m in p.mentions)
             and (not wanted or _padded(p.since_key) <= _padded(wanted))]
    if tools:  # a benchmark tool the row names, from the release its profile describes on
        pick = max(tools, key=lambda p: _padded(p.since_key))
        return pick, f"{text}: {pick.name} (names {', '.join(pick.mentions)})"
    defaults = sorted((p for p in profiles if p.engine == family and not p.harness), key=lambda p: p.version_key)
    if not defaults:
        raise SpecError("framework", text, f"engine family {family} has no release profile (all are harnesses)")
    pick = _nearest_release(defaults, wanted)
    shown = ".".join(map(str, wanted)) or "(no version)"
    return pick, f"{text}: {family} {shown} -> {pick.name} {pick.version} (nearest release profile)"


def _nearest_release(releases: list[EngineProfile], wanted: tuple[int, ...]) -> EngineProfile:
    """Of releases sorted by version: the newest when no version is named; else the one with the latest ``since``
    at or below the named release (the engine as it was then: vLLM 0.8 runs V1, TensorRT-LLM 0.19 the TensorRT
    engine flow); else, older than every profile, the oldest."""
    if not wanted:
        return releases[-1]
    below = [p for p in releases if _padded(p.since_key) <= _padded(wanted)]
    return max(below, key=lambda p: (_padded(p.since_key), _padded(p.version_key))) if below else releases[0]


def _padded(version: tuple[int, ...]) -> tuple[int, ...]:
    """A release number to four places, so that "3.0" compares as the 3.0.0 release it names."""
    return version + (0,) * (4 - len(version))


def dataset_names() -> list[str]:
    """Names of every benchmark dataset in the catalog."""
    return sorted(_catalog("datasets"))


@lru_cache(maxsize=64)
def dataset(ref: str) -> Dataset:
    """A benchmark dataset by catalog name (``sharegpt``)."""
    return dataset_from_dict(_entry("datasets", "dataset", ref), f"dataset[{ref}]")


def dataset_for(text: str) -> Dataset | None:
    """The dataset whose ``matches`` prefixes ``text`` (a row's ``input_len`` such as "ShareGPT (variable)"), or
    None."""
    low = text.strip().lower()
    for name in dataset_names():
        d = dataset(name)
        if any(low.startswith(m) for m in d.matches):
            return d
    return None


_SHORTHAND = re.compile(r"\s*[0-9]+x")


def cluster(ref: str) -> ClusterSpec:
    """A cluster from the shorthand ``1024xa100-80gb[+...]`` or from a cluster TOML/JSON file (a path that is no
    shorthand is read as a file, so that a missing file or a folder is named as such)."""
    if (ref and _exists(ref)) or (_looks_like_path(ref) and not _SHORTHAND.match(ref)):
        return cluster_from_dict(read_file(ref), gpu, ref)
    return parse_gpus(ref, gpu)


def _exists(ref: str) -> bool:
    """``ref`` names something on disk (a name the file system cannot even hold does not)."""
    try:
        return Path(ref).exists()
    except (OSError, ValueError):  # too long, or a NUL byte
        return False


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
    stack, version = stack.strip().lower().replace("_", "-"), version.strip().lower()
    presets = [framework(n) for n in framework_names()]
    mine = [p for p in presets if stack in p.stacks]
    if not mine and stack:  # "MosaicML llm-foundry", "NeMo/Megatron-Core": the stack the text names first (the
        # longest name starting there: "megatron-core" before "megatron")
        named = sorted({s for p in presets for s in p.stacks if s in stack}, key=lambda s: (stack.find(s), -len(s)))
        mine = [p for p in presets if named and named[0] in p.stacks]
    if version:
        bare = re.sub(r"^v(?=\d)", "", version)  # "v0.5.0" is release 0.5.0 (a preset may list "v2" itself)
        by_version = [p for p in mine if any(version.startswith(v.lower()) or bare.startswith(v.lower())
                                             for v in p.versions)]
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
