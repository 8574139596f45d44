"""The simulator as the cost model's pipeline-time function (``estimate(..., pipeline=simulated_pipeline())``)."""

from __future__ import annotations

from meshplan.cost.pipeline import PipelineTime
from meshplan.cost.result import StageTimes
from meshplan.sim.engine import simulate
from meshplan.sim.schedule import Schedule


def simulated_pipeline(schedule: Schedule | None = None):
    """A ``f(name, times, *, pp, vpp, n_micro) -> PipelineTime`` backed by the event simulator; with
    ``schedule`` (e.g. a custom CSV) that schedule replaces the plan's named one."""

    def run(name: str, times: StageTimes, *, pp: int, vpp: int, n_micro: int) -> PipelineTime:
        tl = simulate(schedule or name, times, pp=pp, vpp=vpp, n_micro=n_micro)
        busy = max(tl.busy)
        return PipelineTime(step=tl.pipeline_time, busy=busy, bubble=tl.pipeline_time - busy, p2p=0.0)

    return run
