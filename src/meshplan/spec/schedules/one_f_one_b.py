"""1F1B / PipeDream-Flush (Narayanan et al. 2021, sec. 2.2.1): warm-up forwards, then forward and backward
alternately, so rank r never holds more than pp - r micro-batches."""

from meshplan.spec.schedules import ScheduleSpec
from meshplan.spec.schedules._forms import looped_fill, one_f_one_b_inflight

SCHEDULE = ScheduleSpec(
    name="1f1b", placement="loop", chunks=(1, 1), torch_class="Schedule1F1B", torchtitan="1F1B",
    closed_form_exact=True, zero_bubble=False, forwards_first=False, source="Narayanan et al. 2021 sec. 2.2.1",
    fill=lambda work, pp, vpp, m: looped_fill(work, 1.0, 0.0),
    fill_coefficient=lambda pp, vpp, m, share: (1.0, 0.0),
    # One down-and-up trip per pp micro-batches in the steady state (its warm-up leaves no slack); simulator-derived,
    # tests/unit/test_sim_closed_form.py.
    p2p_factor=lambda pp, vpp, m: 2.0 * ((pp - 1) * (1 + m / pp) - 1),
    inflight=lambda pp, vpp, m, r, w_hold: one_f_one_b_inflight(pp, m, r),
    other_chunks="interleaved_1f1b",
)
