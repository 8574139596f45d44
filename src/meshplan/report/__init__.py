"""Reports of one plan: a self-contained HTML page (plotly, the ``report`` extra) and the same content as
terminal text.

Public API::

    build_report(model, cluster, plan, est, timeline, *, alternatives=(), alternatives_kind=VARIANT_KIND,
                 memory_limit=None, skipped=()) -> Report       # alternatives: Alternative or (label, Plan, Estimate)
    from_search(result, *, timeline, index=0) -> Report         # a plan-search result's winner and runners-up
    evaluate_variants(model, cluster, plan, *, pipeline=None) -> (list[Alternative], list[str])
    pareto_front(points) -> list[int]                           # (time, memory) pairs, both minimized
    render_html(report) -> str                                  # needs plotly; MeshplanError if missing
    render_text(report, *, width=100) -> str                    # rich tables as plain text
"""

from __future__ import annotations

from meshplan.report.data import (
    SEARCH_KIND,
    VARIANT_KIND,
    Alternative,
    Report,
    build_report,
    from_search,
    pareto_front,
)
from meshplan.report.variants import evaluate_variants, plan_variants


def render_html(report: Report, **kwargs) -> str:
    """The HTML page (see ``meshplan.report.html.render_html``)."""
    from meshplan.report.html import render_html as _render

    return _render(report, **kwargs)


def render_text(report: Report, **kwargs) -> str:
    """The terminal text (see ``meshplan.report.text.render_text``)."""
    from meshplan.report.text import render_text as _render

    return _render(report, **kwargs)


__all__ = ["SEARCH_KIND", "VARIANT_KIND", "Alternative", "Report", "build_report", "evaluate_variants",
           "from_search", "pareto_front", "plan_variants", "render_html", "render_text"]
