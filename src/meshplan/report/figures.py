"""Plotly figures of a report: Gantt chart of the simulated step, memory per pipeline rank, time breakdown and
the step-time/memory Pareto front. plotly is imported lazily (the ``report`` extra)."""

from __future__ import annotations

from meshplan.cost.result import INSIDE_COMPUTE
from meshplan.errors import MeshplanError
from meshplan.report.analysis import (
    GIB,
    comparisons,
    component_name,
    time_shares,
)
from meshplan.report.data import Report
from meshplan.report.gantt import KIND_NAMES, GanttData
from meshplan.report.layout import layout_text

KIND_COLORS = {"F": "#4C78A8", "B": "#E45756", "I": "#F58518", "W": "#54A24B", "SEND_F": "#9ECAE9",
               "SEND_B": "#FFBF79", "DP": "#B279A2", "AGG": "#BAB0AC"}
MEMORY_COLORS = {"params": "#4C78A8", "grads": "#72B7B2", "optimizer": "#54A24B", "activations": "#F58518",
                 "buffers": "#B279A2", "reserved": "#BAB0AC"}
FONT = "system-ui, -apple-system, 'Segoe UI', sans-serif"
"""Local fonts only: the page must not fetch anything."""


PARETO_GROUPS = (("this plan", "star", "#E45756", 16), ("better", "circle", "#54A24B", 10),
                 ("trade-off", "circle", "#F58518", 10), ("loses", "circle", "#4C78A8", 10),
                 ("same", "circle", "#4C78A8", 10), ("does not fit", "x", "#888888", 10))
"""(status, marker symbol, color, size) of each group of points in the Pareto chart."""


def plotly_go():
    """``plotly.graph_objects``, or a one-line MeshplanError saying how to install it."""
    try:
        import plotly.graph_objects as go
    except ImportError as exc:
        raise MeshplanError("the HTML report needs plotly: pip install 'meshplan[report]'") from exc
    return go


def _layout(go, title: str, height: int):
    return go.Layout(title=title, height=height, font={"family": FONT, "size": 12}, template="plotly_white",
                     margin={"l": 110, "r": 30, "t": 50, "b": 50}, legend={"orientation": "h", "y": -0.12})


def gantt_figure(data: GanttData, *, title: str):
    """Horizontal bars per lane, one trace per action kind (aggregates first, so details draw on top)."""
    go = plotly_go()
    kinds = sorted({b.kind for b in data.bars}, key=lambda k: (k != "AGG", list(KIND_COLORS).index(k)
                                                             if k in KIND_COLORS else 99))
    fig = go.Figure(layout=_layout(go, title,
                                   height=140 + 20 * len(data.lanes)))
    for kind in kinds:
        bars = [b for b in data.bars if b.kind == kind]
        hover = [_hover(b) for b in bars]
        fig.add_trace(go.Bar(name=KIND_NAMES.get(kind, kind), orientation="h", y=[b.lane for b in bars],
                             base=[b.start for b in bars], x=[b.end - b.start for b in bars],
                             marker={"color": KIND_COLORS.get(kind, "#888"), "line": {"width": 0}},
                             customdata=hover, hovertemplate="%{customdata}<extra></extra>"))
    fig.update_layout(barmode="overlay", bargap=0.25, xaxis_title="time (s)")
    fig.update_yaxes(categoryorder="array", categoryarray=list(data.lanes), autorange="reversed")
    return fig


def _hover(bar) -> str:
    where = "" if bar.stage < 0 else f"<br>stage {bar.stage}, micro-batch {bar.microbatch}"
    return (f"{bar.lane}: {bar.label}{where}<br>{bar.start:.4f} – {bar.end:.4f} s "
            f"({1e3 * (bar.end - bar.start):.2f} ms)")


def memory_figure(rep: Report):
    """Stacked memory components per pipeline rank (GiB) with device capacity and the planner's limit."""
    go = plotly_go()
    per = rep.estimate.memory_per_stage or (rep.estimate.memory,)
    ranks = [f"r{r}" for r in range(len(per))]
    fig = go.Figure(layout=_layout(go, "Peak memory per GPU, by pipeline rank", height=420))
    for comp, color in MEMORY_COLORS.items():
        vals = [getattr(m, comp) / GIB for m in per]
        fig.add_trace(go.Bar(name=comp, x=ranks, y=vals, marker_color=color,
                             hovertemplate=f"%{{x}} {comp}: %{{y:.2f}} GiB<extra></extra>"))
    fig.update_layout(barmode="stack", yaxis_title="GiB", xaxis_title="pipeline rank")
    cap = rep.estimate.capacity / GIB
    fig.add_hline(y=cap, line={"color": "#d62728", "dash": "dash"}, annotation_text=f"capacity {cap:.1f} GiB")
    if rep.memory_limit is not None:
        lim = rep.memory_limit / GIB
        fig.add_hline(y=lim, line={"color": "#ff7f0e", "dash": "dot"}, annotation_text=f"limit {lim:.1f} GiB",
                      annotation_position="bottom right")
    return fig


def time_figure(rep: Report):
    """Components of the step time (s), largest first; recompute is shown apart as it sits inside compute."""
    go = plotly_go()
    rows = list(reversed(time_shares(rep.estimate)))
    names = [component_name(k) for k, _, _ in rows]
    colors = ["#BAB0AC" if k in INSIDE_COMPUTE else "#4C78A8" if k == "compute" else "#E45756" for k, _, _ in rows]
    fig = go.Figure(layout=_layout(go, f"Where the {rep.estimate.step_time:.3f} s step goes",
                                   height=120 + 30 * len(rows)))
    fig.add_trace(go.Bar(orientation="h", y=names, x=[v for _, v, _ in rows], marker_color=colors,
                         text=[f"{100 * s:.1f} %" for _, _, s in rows], textposition="auto",
                         hovertemplate="%{y}: %{x:.4f} s<extra></extra>", showlegend=False))
    fig.update_layout(xaxis_title="s per step")
    return fig


def chart_top(rep: Report) -> float:
    """Top of the memory axis (bytes): room above the limit and every fitting plan; plans above it are drawn
    on the edge (a 400 GiB outlier would otherwise flatten the front)."""
    fitting = [mem for _, _, mem in rep.points() if mem <= rep.limit]
    return 1.25 * max([rep.limit] + fitting)


def pareto_figure(rep: Report):
    """Step time vs peak memory of the plan and its alternatives; the Pareto front joined by a line."""
    go = plotly_go()
    pts = rep.points()
    top = chart_top(rep)
    status = ["this plan"] + [c.status for c in comparisons(rep)]
    layouts = [layout_text(rep.plan)] + [layout_text(a.plan) for a in rep.alternatives]
    fig = go.Figure(layout=_layout(go, f"Step time vs peak memory ({rep.alternatives_kind})", height=480))
    front = [pts[i] for i in rep.pareto]
    fig.add_trace(go.Scatter(name="Pareto front", x=[p[1] for p in front], y=[p[2] / GIB for p in front],
                             mode="lines", line={"color": "#54A24B", "dash": "dot"}, hoverinfo="skip"))
    for name, symbol, color, size in PARETO_GROUPS:
        idx = [i for i, s in enumerate(status) if s == name]
        if not idx:
            continue
        fig.add_trace(go.Scatter(
            name=name, x=[pts[i][1] for i in idx], y=[min(pts[i][2], top) / GIB for i in idx], mode="markers",
            marker={"symbol": [symbol if pts[i][2] <= top else "triangle-up" for i in idx], "color": color,
                    "size": size},
            customdata=[f"{pts[i][0]}{' (Pareto)' if i in rep.pareto else ''}<br>{layouts[i]}<br>"
                        f"{pts[i][1]:.3f} s, {pts[i][2] / GIB:.1f} GiB" for i in idx],
            hovertemplate="%{customdata}<extra></extra>"))
    lim = rep.limit / GIB
    fig.add_hline(y=lim, line={"color": "#d62728", "dash": "dash"},
                  annotation_text=f"{'limit' if rep.memory_limit is not None else 'capacity'} {lim:.1f} GiB")
    fig.update_layout(xaxis_title="step time (s)", yaxis_title="peak memory per GPU (GiB)",
                      yaxis_range=[0, top / GIB])
    return fig
