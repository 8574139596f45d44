"""Search: enumerate -> prune -> partition -> rank. Public API::

    search(model, cluster, request: SearchRequest, *, calib=None, progress=None) -> SearchResult
    render_text(result) -> str          # ranked table, Pareto front, explanation of the winner
    result_json(result) -> dict         # {"plans": [...], "considered", "pruned", "search_time_s", ...}
"""

from meshplan.search.driver import search
from meshplan.search.render import render_text, result_json
from meshplan.search.request import SearchRequest
from meshplan.search.result import RankedPlan, SearchResult

__all__ = ["RankedPlan", "SearchRequest", "SearchResult", "render_text", "result_json", "search"]
