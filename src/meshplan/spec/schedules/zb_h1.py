"""ZB-H1 (Qi et al. 2023, sec. 3.1): 1F1B with the backward split into input (I) and weight (W) gradients, the W
passes deferred to fill the bubble; same activation peak as 1F1B plus the deferred W inputs."""

from meshplan.spec.schedules import ScheduleSpec
from meshplan.spec.schedules._forms import one_f_one_b_inflight, zero_bubble_fill


def _inflight(pp: int, vpp: int, m: int, r: int, w_hold: float) -> float:
    """1F1B's p - r plus the ``w_hold`` share of its r deferred W passes."""
    base = one_f_one_b_inflight(pp, m, r)
    return base + w_hold * min(r, m - base)


SCHEDULE = ScheduleSpec(
    name="zb_h1", placement="loop", chunks=(1, 1), torch_class="ScheduleInterleavedZeroBubble",
    torchtitan="InterleavedZeroBubble", closed_form_exact=True, zero_bubble=True, forwards_first=False,
    source="Qi et al. 2023 sec. 3.1",
    # (p - 1) max(F + I - W, I); the paper's (p - 1)(F + B - W) when W <= F.
    fill=lambda work, pp, vpp, m: zero_bubble_fill(work, halve=False),
    fill_coefficient=lambda pp, vpp, m, share: (share, 0.0),
    p2p_factor=lambda pp, vpp, m: 4.0 * (pp - 1),
    inflight=_inflight,
    other_chunks="zbv",
)
