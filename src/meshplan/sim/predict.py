"""The estimate with its pipeline chosen by the schedule registry: the closed form where the schedule's is exact
on the plan's stages, the event simulator otherwise (``meshplan.spec.schedules.needs_simulation``)."""

from __future__ import annotations

from meshplan.cost.estimate import estimate
from meshplan.cost.result import Estimate
from meshplan.errors import SpecError
from meshplan.sim.adapter import simulated_pipeline
from meshplan.sim.schedule import Schedule
from meshplan.spec.cluster import ClusterSpec
from meshplan.spec.framework import FrameworkProfile
from meshplan.spec.model import ModelSpec
from meshplan.spec.plan import Plan
from meshplan.spec.schedules import needs_simulation


def predict(model: ModelSpec, cluster: ClusterSpec, plan: Plan, *, stack: FrameworkProfile | None = None,
            calib: dict | None = None, schedule: Schedule | None = None, simulate: bool | None = None) -> Estimate:
    """Predict one optimizer step of ``plan`` (``meshplan.cost.estimate.estimate``), simulating the pipeline when
    the closed form is not exact for it: a zero-bubble V schedule, a custom ``schedule`` (e.g. a CSV), or an
    uneven layer split. ``simulate`` True or False overrides the rule. A custom ``schedule`` must be written for
    the plan's pipeline ranks, virtual stages and micro-batches (SpecError otherwise)."""
    if schedule is not None:
        check_schedule_fits(schedule, plan)
    use = needs_simulation(plan.schedule_name, pp=plan.pp, uneven=bool(plan.layer_split)) or schedule is not None
    if simulate is not None:
        use = simulate
    return estimate(model, cluster, plan, stack=stack, calib=calib,
                    pipeline=simulated_pipeline(schedule) if use and plan.pp > 1 else None)


def check_schedule_fits(schedule: Schedule, plan: Plan) -> None:
    """Raise SpecError when a custom schedule runs another pipeline than the plan's: its ranks, stages and
    micro-batches are what the simulator times (a schedule of half the micro-batches would claim twice the
    tokens per second)."""
    for what, got, want in (("pipeline ranks", schedule.pp, plan.pp), ("virtual stages", schedule.n_stages,
                            plan.n_stages), ("micro-batches", schedule.n_micro, plan.n_micro)):
        if got != want:
            raise SpecError("--schedule-file", schedule.name,
                            f"is written for {got} {what}, the plan has {want} (pp={plan.pp}, vpp={plan.vpp}, "
                            f"global_batch/(dp*micro_batch)={plan.n_micro})")
