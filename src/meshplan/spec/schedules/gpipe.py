"""GPipe (Huang et al. 2019): all forwards, then all backwards; every micro-batch's activations at once."""

from meshplan.spec.schedules import ScheduleSpec
from meshplan.spec.schedules._forms import looped_fill

SCHEDULE = ScheduleSpec(
    name="gpipe", placement="loop", chunks=(1, 1), torch_class="ScheduleGPipe", torchtitan="GPipe",
    closed_form_exact=True, zero_bubble=False, forwards_first=True, source="Huang et al. 2019",
    # (p - 1)(F + I + W) on equal stages: sum_r W_r - max_r W_r (Narayanan et al. 2021 eq. 1).
    fill=lambda work, pp, vpp, m: looped_fill(work, 1.0, 0.0),
    fill_coefficient=lambda pp, vpp, m, share: (1.0, 0.0),
    # One trip down and one up over the pp ranks.
    p2p_factor=lambda pp, vpp, m: 2.0 * (pp - 1),
    inflight=lambda pp, vpp, m, r, w_hold: float(m),
    other_chunks="looped_bfs",
)
