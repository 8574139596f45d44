"""DualPipeV (DeepSeek-AI 2024, DeepSeek-V3 report sec. 3.2.1; the V variant of DualPipe): two chunks per rank
in a V, forward and backward of different chunks paired; PP + 1 chunk activations at the peak."""

from meshplan.spec.schedules import ScheduleSpec
from meshplan.spec.schedules._forms import zero_bubble_fill

SCHEDULE = ScheduleSpec(
    name="dualpipev", placement="v", chunks=(2, 2), torch_class="ScheduleDualPipeV", torchtitan="DualPipeV",
    closed_form_exact=False, zero_bubble=True, forwards_first=False, source="DeepSeek-AI 2024 sec. 3.2.1",
    fill=lambda work, pp, vpp, m: zero_bubble_fill(work, halve=True),
    fill_coefficient=lambda pp, vpp, m, share: (share / 2, 0.0),
    p2p_factor=lambda pp, vpp, m: 2.0 * (pp * vpp - 1),
    inflight=lambda pp, vpp, m, r, w_hold: pp + 0.5,
    constraint=lambda pp, vpp, m: "" if m >= 2 * pp else
    f"dualpipev needs at least 2*pp = {2 * pp} micro-batches, the plan has {m}",
)
