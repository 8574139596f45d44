"""Interleaved 1F1B (Narayanan et al. 2021, sec. 2.2.2): v chunks per rank, micro-batches in rounds, so the fill
and drain shrink by v at the cost of more activations in flight."""

from meshplan.spec.schedules import ScheduleSpec
from meshplan.spec.schedules._forms import interleave_rounds_ok, looped_fill


def _coefficient(pp: int, vpp: int, m: int, share: float) -> tuple[float, float]:
    """(p - 1)(F + I + W) / v, plus (v - 1)(p - m) max_r W_r / v when m < p (ibid.)."""
    v = max(vpp, 1)
    return 1.0 / v, (v - 1) * max(pp - m, 0) / v


def _inflight(pp: int, vpp: int, m: int, r: int, w_hold: float) -> float:
    """Warm-up forwards plus one, ``(v-1) g + 2(p-1-r) + 1`` chunk-micro-batches with g micro-batches per round
    (Korthikanti et al. 2022 sec. 4.2.3: first stage p + (p-1)/v), in units of the rank's whole share."""
    if vpp == 1:
        return float(min(pp - r, m))
    per_round = m // max(1, m // pp)
    warm = (vpp - 1) * per_round + 2 * (pp - 1 - r) + 1
    return min(warm, m * vpp) / vpp


SCHEDULE = ScheduleSpec(
    name="interleaved_1f1b", placement="loop", chunks=(2, 0), torch_class="ScheduleInterleaved1F1B",
    torchtitan="Interleaved1F1B", closed_form_exact=True, zero_bubble=False, forwards_first=False,
    source="Narayanan et al. 2021 sec. 2.2.2",
    fill=lambda work, pp, vpp, m: looped_fill(work, *_coefficient(pp, vpp, m, 0.0)),
    fill_coefficient=_coefficient,
    # The fill and drain trips over all pp * v stages once.
    p2p_factor=lambda pp, vpp, m: 2.0 * (pp * vpp - 1),
    inflight=_inflight,
    constraint=lambda pp, vpp, m: "" if interleave_rounds_ok(pp, m) else
    f"interleaved schedules need the {m} micro-batches divisible by max(1, m // pp) = {max(1, m // pp)} rounds",
    other_chunks="1f1b",
)
