"""A small neighbourhood of one plan, evaluated with the same cost model: the alternatives a report shows when
no plan search supplied runners-up. Same parallel degrees; other recompute modes, micro-batch sizes, ZeRO
stages and pipeline schedules."""

from __future__ import annotations

from typing import Callable, Iterator

from meshplan import catalog
from meshplan.cost.estimate import estimate
from meshplan.errors import MeshplanError
from meshplan.report.data import Alternative
from meshplan.spec.checks import stack_violations
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.framework import FrameworkProfile
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import RECOMPUTE, Plan


def _recompute(plan: Plan, stack: FrameworkProfile) -> Iterator[tuple[str, Plan]]:
    for mode in RECOMPUTE:
        if mode != plan.recompute and mode in stack.recompute_modes:
            yield f"recompute={mode}", plan.with_(recompute=mode, recompute_layers=0)


def _micro_batch(plan: Plan, stack: FrameworkProfile) -> Iterator[tuple[str, Plan]]:
    per_replica = plan.global_batch // plan.dp
    for mb in (plan.micro_batch // 2, plan.micro_batch * 2):
        if mb >= 1 and per_replica % mb == 0:
            yield f"micro_batch={mb}", plan.with_(micro_batch=mb)


def _zero(plan: Plan, stack: FrameworkProfile) -> Iterator[tuple[str, Plan]]:
    if plan.dp * plan.cp == 1:
        return
    top = 0 if stack.sharding == "none" else (stack.max_zero_with_pp if plan.pp > 1 else 3)
    for z in range(top + 1):
        if z != plan.zero:
            yield f"zero={z}", plan.with_(zero=z, dp_shard=plan.dp_shard if z == 3 else 0)


def _schedules(plan: Plan, stack: FrameworkProfile) -> Iterator[tuple[str, Plan]]:
    """Each other schedule the stack runs, at the plan's vpp when the schedule accepts it, else at 1 or 2."""
    from meshplan.sim import get_schedule

    if plan.pp == 1:
        return
    for name in sorted(stack.schedules):
        if name == plan.schedule_name:
            continue
        for vpp in dict.fromkeys((plan.vpp, 1, 2)):
            try:
                get_schedule(name, pp=plan.pp, vpp=vpp, n_micro=plan.n_micro)
            except MeshplanError:
                continue
            suffix = "" if vpp == plan.vpp else f" vpp={vpp}"
            yield f"schedule={name}{suffix}", plan.with_(schedule=name, vpp=vpp, layer_split=())
            break


VARIANT_FAMILIES: tuple[Callable[[Plan, FrameworkProfile], Iterator[tuple[str, Plan]]], ...] = (
    _recompute, _micro_batch, _zero, _schedules)
"""Generators of (label, plan) neighbours the stack can run; adding a family is adding a generator here."""


def plan_variants(plan: Plan, stack: FrameworkProfile) -> list[tuple[str, Plan]]:
    """Labelled neighbours of ``plan`` with the same parallel degrees (tp, cp, pp, dp, ep) that ``stack`` runs."""
    out: list[tuple[str, Plan]] = []
    for family in VARIANT_FAMILIES:
        try:
            out.extend(family(plan, stack))
        except MeshplanError:
            continue
    return out


def evaluate_variants(model: ModelSpec, cluster: ClusterSpec, plan: Plan, *, stack: FrameworkProfile | None = None,
                      pipeline=None) -> tuple[list[Alternative], list[str]]:
    """Estimate every neighbour of ``plan`` that its stack can run.

    Args:
        stack: the plan's software stack (a neighbour it cannot run is skipped with the reason); None = the
            preset the plan names.
        pipeline: pipeline-time function passed to ``estimate`` (use the same one as for the plan itself).

    Returns:
        The evaluated alternatives, and ``label: reason`` for each neighbour the model rejects.
    """
    stack = stack or catalog.framework(plan.framework)
    alts, skipped = [], []
    for label, variant in plan_variants(plan, stack):
        bad = stack_violations(variant, stack)
        if bad:
            skipped.append(f"{label}: {bad[0]}")
            continue
        try:
            est = estimate(model, cluster, variant, stack=stack, pipeline=pipeline)
        except MeshplanError as exc:
            skipped.append(f"{label}: {exc}")
            continue
        alts.append(Alternative(label=label, plan=variant, estimate=est))
    return alts, skipped
