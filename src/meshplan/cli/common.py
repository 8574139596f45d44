"""Helpers shared by CLI commands: resolving references, printing JSON and tables."""

from __future__ import annotations

import json
import sys

from meshplan import catalog
from meshplan.errors import SpecError
from meshplan.spec.cluster import ClusterSpec
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


def print_json(obj: object) -> None:
    """One JSON object on stdout."""
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def gib(x: float) -> str:
    """Bytes as GiB with one decimal."""
    return f"{x / 2**30:.1f}"
