"""Chrome / Perfetto trace of a simulated pipeline step (the Trace Event Format's "X" complete events), so
the predicted step opens in chrome://tracing or ui.perfetto.dev next to a PyTorch profiler trace.

One process per pipeline rank; one thread (lane) for compute, one per link the rank sends on, one for the
data-parallel gradient tail. Times are in microseconds, as the format requires.
"""

from __future__ import annotations

import json
from pathlib import Path

from meshplan.sim.timeline import Timeline

_US = 1e6


def _lane_ids(timeline: Timeline, rank: int) -> dict[str, int]:
    """Thread id per lane: compute 0, then sends by destination rank, then dp."""
    g = timeline.graph
    dsts = sorted({g.dst[i] for i in range(g.offsets[rank], g.offsets[rank + 1]) if g.dst[i] >= 0})
    lanes = {"compute": 0}
    for k, d in enumerate(dsts, start=1):
        lanes[f"send->r{d}"] = k
    lanes["dp"] = len(lanes)
    return lanes


def trace_events(timeline: Timeline) -> list[dict]:
    """Trace events: metadata (process/thread names and order) then one "X" event per span."""
    events: list[dict] = []
    for rank in range(timeline.graph.schedule.pp):
        lanes = _lane_ids(timeline, rank)
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"pp rank {rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
        for lane, tid in lanes.items():
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": lane}})
        for span in timeline.spans(rank):
            events.append({"ph": "X", "name": span.name, "cat": "compute" if span.lane == "compute" else "comm",
                           "pid": rank, "tid": lanes[span.lane], "ts": span.start * _US,
                           "dur": (span.end - span.start) * _US,
                           "args": {"kind": span.kind, "stage": span.stage, "microbatch": span.microbatch}})
    return events


def chrome_trace(timeline: Timeline) -> dict:
    """The whole trace document."""
    sched = timeline.graph.schedule
    return {"traceEvents": trace_events(timeline), "displayTimeUnit": "ms",
            "otherData": {"schedule": sched.name, "pp": sched.pp, "n_stages": sched.n_stages,
                          "n_micro": sched.n_micro, "step_time_s": timeline.step_time,
                          "bubble_per_rank": list(timeline.bubble)}}


def write_chrome_trace(timeline: Timeline, path: str | Path) -> None:
    """Write the trace JSON to ``path``."""
    Path(path).write_text(json.dumps(chrome_trace(timeline)))
