"""The simulated step as Gantt bars: one lane per rank's compute, one per send direction, one for its
data-parallel tail. Long schedules keep the first and last micro-batches in detail and merge the steady state
into aggregate bars, so the page stays small and fast to draw."""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.sim.timeline import Span, Timeline

MAX_BARS = 4000
"""Bars drawn at most; beyond it the steady state is aggregated (each bar is ~100 bytes of HTML and one SVG
path, and browsers slow down past a few thousand)."""
PIXELS = 2000
"""Horizontal resolution assumed for merging: gaps narrower than step/PIXELS are invisible anyway."""
KIND_NAMES = {"F": "forward", "B": "backward", "I": "backward (input grad)", "W": "backward (weight grad)",
              "SEND_F": "send activations", "SEND_B": "send gradients", "DP": "data-parallel reduction",
              "AGG": "steady state (aggregated)"}


@dataclass(frozen=True, kw_only=True)
class Bar:
    """One drawn interval (s)."""

    lane: str
    """Row label, e.g. ``r0``, ``r0 send→r1`` or ``r0 dp``."""
    kind: str
    """A key of KIND_NAMES."""
    start: float
    end: float
    label: str
    """Hover text: the action, or how many actions an aggregate holds."""
    stage: int = -1
    microbatch: int = -1


@dataclass(frozen=True, kw_only=True)
class GanttData:
    """Bars and lanes of one simulated step."""

    lanes: tuple[str, ...]
    """Row labels, top to bottom."""
    bars: tuple[Bar, ...]
    """What to draw."""
    n_spans: int
    """Spans in the simulated step."""
    detail_micro: int
    """Micro-batches drawn in detail at each end; -1 = all of them."""
    note: str = ""
    """What was aggregated, in words (empty when everything is drawn)."""


def lane_label(rank: int, lane: str) -> str:
    """Row label of a rank's lane (``compute``, ``send->r<k>`` or ``dp``)."""
    if lane == "compute":
        return f"r{rank}"
    if lane.startswith("send->"):
        return f"r{rank} send→{lane[len('send->'):]}"
    return f"r{rank} {lane}"


def lane_of(span: Span) -> str:
    """Row label of a span."""
    return lane_label(span.rank, span.lane)


def _bar(span: Span) -> Bar:
    return Bar(lane=lane_of(span), kind=span.kind, start=span.start, end=span.end, label=span.name,
               stage=span.stage, microbatch=span.microbatch)


def _lanes(spans: list[Span]) -> tuple[str, ...]:
    """Lanes in rank order: compute, sends, dp."""
    order = {"compute": 0, "dp": 2}
    keys = sorted({(s.rank, order.get(s.lane, 1), s.lane) for s in spans})
    return tuple(lane_label(r, lane) for r, _, lane in keys)


def _detail_window(spans: list[Span], n_micro: int, budget: int) -> int:
    """Largest k such that the spans of the first and last k micro-batches (and the dp tails) fit ``budget``."""
    per_mb = [0] * n_micro
    fixed = 0
    for s in spans:
        if s.microbatch < 0:
            fixed += 1
        else:
            per_mb[s.microbatch] += 1
    k = 0
    while 2 * (k + 1) < n_micro and fixed + sum(per_mb[:k + 1]) + sum(per_mb[n_micro - k - 1:]) <= budget:
        k += 1
    return k


def _merge(spans: list[Span], tol: float) -> list[Bar]:
    """Merge consecutive spans of one lane into aggregate bars, breaking at gaps wider than ``tol``."""
    out: list[Bar] = []
    run: list[Span] = []

    def flush() -> None:
        if run:
            out.append(Bar(lane=lane_of(run[0]), kind="AGG", start=run[0].start, end=run[-1].end,
                           label=f"{len(run)} actions aggregated"))
            run.clear()

    for s in sorted(spans, key=lambda s: (lane_of(s), s.start)):
        if run and (lane_of(s) != lane_of(run[-1]) or s.start - run[-1].end > tol):
            flush()
        run.append(s)
    flush()
    return out


def _span_text(lo: int, hi: int) -> str:
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def gantt_data(timeline: Timeline, *, max_bars: int = MAX_BARS) -> GanttData:
    """Bars of every rank's spans; past ``max_bars`` the middle micro-batches are merged per lane."""
    spans = [s for r in range(len(timeline.busy)) for s in timeline.spans(r)]
    lanes = _lanes(spans)
    if len(spans) <= max_bars:
        return GanttData(lanes=lanes, bars=tuple(_bar(s) for s in spans), n_spans=len(spans), detail_micro=-1)
    n_micro = 1 + max(s.microbatch for s in spans)
    k = _detail_window(spans, n_micro, max_bars // 2)
    keep = [s for s in spans if s.microbatch < k or s.microbatch >= n_micro - k]
    middle = [s for s in spans if k <= s.microbatch < n_micro - k]
    merged = _merge(middle, timeline.step_time / PIXELS)
    if len(keep) + len(merged) > max_bars:
        merged = _merge(middle, float("inf"))
    note = (f"{len(spans):,} simulated actions: micro-batches {_span_text(0, k - 1)} and "
            f"{_span_text(n_micro - k, n_micro - 1)} are drawn "
            f"in detail, the {len(middle):,} actions of the steady state in between are merged into "
            f"{len(merged):,} grey bars") if k else (
            f"{len(spans):,} simulated actions merged into {len(merged):,} grey bars")
    bars = tuple(_bar(s) for s in keep) + tuple(merged)
    return GanttData(lanes=lanes, bars=bars, n_spans=len(spans), detail_micro=k, note=note)
