"""Looped BFS (torch's ScheduleLoopedBFS): GPipe over several chunks per rank, chunk by chunk, breadth first."""

from meshplan.spec.schedules import ScheduleSpec
from meshplan.spec.schedules._forms import looped_fill

SCHEDULE = ScheduleSpec(
    name="looped_bfs", placement="loop", chunks=(2, 0), torch_class="ScheduleLoopedBFS", torchtitan="LoopedBFS",
    closed_form_exact=True, zero_bubble=False, forwards_first=True,
    source="Lamy-Poirier 2023, breadth-first pipeline parallelism",
    # GPipe's fill, run on chunks 1/v as long: (sum_r W_r - max_r W_r) / v.
    fill=lambda work, pp, vpp, m: looped_fill(work, 1.0 / max(vpp, 1), 0.0),
    fill_coefficient=lambda pp, vpp, m, share: (1.0 / max(vpp, 1), 0.0),
    # One trip down and one up over the pp ranks, as for GPipe.
    p2p_factor=lambda pp, vpp, m: 2.0 * (pp - 1),
    inflight=lambda pp, vpp, m, r, w_hold: float(m),
    other_chunks="gpipe",
)
