"""Specs: what (ModelSpec), where (ClusterSpec, GPUSpec) and how (Plan), kept apart."""

from meshplan.spec.cluster import ClusterSpec, GroupLink, NetworkLevel, Pool, group_link
from meshplan.spec.hardware import GPUSpec, PeakFlops
from meshplan.spec.model import (
    AttentionSpec,
    BlockSpec,
    LayerSpec,
    ModelSpec,
    MoESpec,
    decoder_model,
)
from meshplan.spec.plan import Plan

__all__ = ["AttentionSpec", "BlockSpec", "ClusterSpec", "GPUSpec", "GroupLink", "LayerSpec", "ModelSpec",
           "MoESpec", "NetworkLevel", "PeakFlops", "Plan", "Pool", "decoder_model", "group_link"]
