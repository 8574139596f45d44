"""Helpers shared by CLI commands: resolving references, printing JSON and tables."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from meshplan import catalog
from meshplan.errors import SpecError
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.framework import FrameworkProfile
from meshplan.spec.model import ModelSpec


def resolve_model(ref: str | None, fallback: str | None = None) -> ModelSpec:
    """A model from ``--model`` (catalog name, model file or HF config.json), else the plan file's reference."""
    ref = ref or fallback
    if not ref:
        raise SpecError("--model", None, "is required (a catalog name or a config.json path)")
    return catalog.model(ref)


def resolve_cluster(gpus: str | None, cluster_file: str | None, fallback: str | None = None) -> ClusterSpec:
    """A cluster from ``--gpus`` shorthand or ``--cluster FILE``, else the plan file's reference."""
    if gpus and cluster_file:
        raise SpecError("--gpus/--cluster", f"{gpus} / {cluster_file}", "give one of them, not both")
    ref = gpus or cluster_file or fallback
    if not ref:
        raise SpecError("--gpus", None, "is required, e.g. --gpus 1024xa100-80gb or --cluster cluster.toml")
    return catalog.cluster(ref)


def resolve_framework(name: str | None, *, file_settings: dict | None = None,
                      flags: dict | None = None) -> FrameworkProfile:
    """The software stack: the catalog preset ``name`` (a plan's ``framework``, or ``--framework``), with the plan
    file's ``[framework]`` settings and then the command's flags (``--grad-dtype``...) on top; None-valued flags
    are not given."""
    if name is not None and not name.strip():
        raise SpecError("--framework", name, f"is empty: name a stack profile (default {catalog.DEFAULT_FRAMEWORK})")
    profile = catalog.framework(name or catalog.DEFAULT_FRAMEWORK)
    changes = {**(file_settings or {}), **{k: v for k, v in (flags or {}).items() if v is not None}}
    return profile.with_(**changes) if changes else profile


def stack_changes(stack: FrameworkProfile) -> dict:
    """What a plan file records of ``stack`` beside its name: the settings that differ from its preset."""
    return stack.changes_from(catalog.framework(stack.name))


def print_json(obj: object) -> None:
    """One JSON object on stdout."""
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def gib(x: float) -> str:
    """Bytes as GiB with one decimal."""
    return f"{x / 2**30:.1f}"


def output_path(flag: str, path: str) -> Path:
    """``path`` as a file this command may write, checked before any work starts: not a folder, in a folder
    that exists and is writable."""
    if not str(path).strip():
        raise SpecError(flag, path, "is empty: give a file name")
    p = Path(path)
    if p.is_dir():
        raise SpecError(flag, path, "is a folder; give a file name")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise SpecError(flag, path, f"cannot be written: folder {parent} does not exist")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise SpecError(flag, path, "cannot be written: permission denied")
    return p


def wrote(path: str | Path, what: str = "") -> None:
    """The one line on stderr that says a file was written."""
    print(f"wrote {path}{f' ({what})' if what else ''}", file=sys.stderr)


NARROW = 80
"""Columns of text when stdout is not a terminal (a pipe, a file, a test): the classic terminal width."""


def term_width() -> int:
    """Columns the command's tables may use: the terminal's width, or NARROW when stdout is not a terminal."""
    import shutil

    if not sys.stdout.isatty():
        return NARROW
    return max(shutil.get_terminal_size((NARROW, 24)).columns, 60)


def cluster_named(field: str, text: str):
    """``catalog.cluster(text)``, its errors naming ``field`` (the flag or file field ``text`` came from)."""
    try:
        return catalog.cluster(text)
    except SpecError as exc:
        if exc.field != "--gpus":
            raise
        raise SpecError(field, exc.value, exc.expected, exc.suggestions) from None
