"""ZB-V (Qi et al. 2024, sec. 6): two chunks per rank in a V, the zero-bubble split of the backward; the same
activation peak as 1F1B's first stage."""

from meshplan.spec.schedules import ScheduleSpec
from meshplan.spec.schedules._forms import zero_bubble_fill

SCHEDULE = ScheduleSpec(
    name="zbv", placement="v", chunks=(2, 2), torch_class="ScheduleZBVZeroBubble", torchtitan="ZBVZeroBubble",
    closed_form_exact=False, zero_bubble=True, forwards_first=False, source="Qi et al. 2024 sec. 6",
    # (p - 1) max(F + I - W, I) / 2, exact only for F = I = W: estimates simulate it.
    fill=lambda work, pp, vpp, m: zero_bubble_fill(work, halve=True),
    fill_coefficient=lambda pp, vpp, m, share: (share / 2, 0.0),
    p2p_factor=lambda pp, vpp, m: 2.0 * (pp * vpp - 1),
    inflight=lambda pp, vpp, m, r, w_hold: min(float(pp), float(m), (m + r + 1) / 2),
)
