"""The report as terminal text (``meshplan explain``): the same content as the HTML page, as rich tables
rendered to plain text and a character timeline of the simulated step."""

from __future__ import annotations

import textwrap
from io import StringIO

from meshplan.report.analysis import (
    comparisons,
    component_name,
    gib,
    headline,
    limiters,
    time_shares,
)
from meshplan.report.data import Report
from meshplan.report.layout import layout_text
from meshplan.sim.timeline import Timeline

TIMELINE_CHARS = {"F": "F", "B": "B", "I": "I", "W": "W", "DP": "d"}
"""Character of each span kind in the text timeline; idle is ``.``, several kinds in one column ``x``."""
MIXED_BELOW = 0.75
"""A column whose largest kind covers less than this share of its busy time is drawn as mixed (``x``)."""
LEGEND = "F forward, B backward, I input grad, W weight grad, d dp reduction, x mixed, . idle"


def ascii_timeline(timeline: Timeline, *, width: int) -> list[str]:
    """One row per pipeline rank, ``width`` columns over the step: in each column the kind that covers most of
    it on the rank's compute lane (or its dp tail), ``.`` where the rank is idle for most of it."""
    step = timeline.step_time or 1.0
    dt = step / width
    rows = []
    for r in range(len(timeline.busy)):
        cover: list[dict[str, float]] = [{} for _ in range(width)]
        for s in timeline.spans(r):
            if s.lane not in ("compute", "dp") or s.end <= s.start:
                continue
            lo, hi = int(s.start / dt), min(int(s.end / dt), width - 1)
            for c in range(lo, hi + 1):
                part = min(s.end, (c + 1) * dt) - max(s.start, c * dt)
                if part > 0:
                    cover[c][s.kind] = cover[c].get(s.kind, 0.0) + part
        line = "".join(_cell(col, dt) for col in cover)
        rows.append(f"r{r:<3d} |{line}|")
    return rows


def _cell(col: dict[str, float], dt: float) -> str:
    busy = sum(col.values())
    if busy < 0.5 * dt:
        return "."
    kind = max(col, key=col.get)
    return TIMELINE_CHARS.get(kind, "?") if col[kind] >= MIXED_BELOW * busy else "x"


def _tables(rep: Report):
    """The rich renderables of the report, in order."""
    from rich.table import Table

    head = Table(title=f"{rep.model.name} on {rep.cluster.describe()}", show_header=False)
    for k, v in [("layout", layout_text(rep.plan))] + headline(rep.estimate):
        head.add_row(k, v)
    yield head
    t = Table(title="where the time goes", show_header=True)
    for col, just in (("component", "left"), ("s", "right"), ("%", "right"), ("", "left")):
        t.add_column(col, justify=just)
    for k, v, share in time_shares(rep.estimate):
        t.add_row(component_name(k), f"{v:.3f}", f"{100 * share:.1f}", "#" * round(30 * share))
    yield t
    yield _memory_table(rep)


def _memory_table(rep: Report):
    from rich.table import Table

    per = rep.estimate.memory_per_stage or (rep.estimate.memory,)
    comps = list(per[0].as_dict())
    m = Table(title=f"memory per GPU by pipeline rank (GiB; capacity {gib(rep.estimate.capacity)})")
    for col in ["rank"] + comps + ["total", "% cap"]:
        m.add_column(col, justify="left" if col == "rank" else "right")
    for r, mb in enumerate(per):
        m.add_row(f"r{r}", *[gib(v) for v in mb.as_dict().values()], gib(mb.total()),
                  f"{100 * mb.total() / rep.estimate.capacity:.0f}")
    return m


def _alternatives_table(rep: Report):
    from rich.table import Table

    t = Table(title=f"alternatives: {rep.alternatives_kind} (* = on the step-time/memory Pareto front)")
    for col, just in (("plan", "left"), ("step s", "right"), ("peak GiB", "right"), ("versus this plan", "left")):
        t.add_column(col, justify=just)
    star = lambda i: " *" if i in rep.pareto else ""  # noqa: E731
    t.add_row("this plan" + star(0), f"{rep.estimate.step_time:.3f}", gib(rep.estimate.peak_memory), "")
    for i, c in enumerate(comparisons(rep), start=1):
        est = rep.alternatives[i - 1].estimate
        t.add_row(c.label + star(i), f"{est.step_time:.3f}", gib(est.peak_memory), f"{c.status}: {c.text}")
    return t


def render_text(rep: Report, *, width: int = 100) -> str:
    """The whole report as plain text, ``width`` columns wide."""
    from rich.console import Console

    buf = StringIO()
    con = Console(file=buf, width=width, force_terminal=False, no_color=True, highlight=False)
    tables = list(_tables(rep))
    for table in tables[:1]:
        con.print(table)
    con.print("what limits this plan:")
    for s in limiters(rep):
        con.print(textwrap.fill(s, width=width, initial_indent="  - ", subsequent_indent="    "), soft_wrap=True)
    for table in tables[1:]:
        con.print(table)
    tl = rep.timeline
    con.print(textwrap.fill(f"one simulated step, {tl.step_time:.3f} s per line ({LEGEND}):", width=width),
              soft_wrap=True)
    for row in ascii_timeline(tl, width=max(20, width - 8)):
        con.print(row, soft_wrap=True)
    if rep.alternatives:
        con.print(_alternatives_table(rep))
    for s in rep.skipped:
        con.print(f"not evaluated: {s}")
    return buf.getvalue()
