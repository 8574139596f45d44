"""Search: enumerate -> prune -> partition -> rank. Public API::

    search(model, cluster, request: SearchRequest, *, calib=None, progress=None) -> SearchResult

Views of a result (the table, the Pareto front, the JSON document) live with the other presentations, in
``meshplan.report.search``.
"""

from meshplan.search.driver import search
from meshplan.search.request import SearchRequest
from meshplan.search.result import RankedPlan, SearchResult

__all__ = ["RankedPlan", "SearchRequest", "SearchResult", "search"]
