"""Length cells of a serving CSV as sources write them: ``1024``, ``1,024``, ``1k``, ``~1000``, ``1024 tokens``,
``512 (fixed)``, a range ``512-1536`` of lengths drawn uniformly, or a catalog dataset's name (``ShareGPT``)."""

from __future__ import annotations

import re

from meshplan import catalog
from meshplan.errors import SpecError

COUNT = re.compile(r"^(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)\s*(k?)$")
"""A token count: digits with or without thousands separators, or a multiple of 1024 written ``1k``, ``1.5k``."""
RANGE = re.compile(r"^(.+?)\s*(?:-|–|to)\s*(.+)$")
UNIFORM_BINS = 8
"""Equal-width bins of a uniform range (8: its p90 within a sixteenth of the range of the exact one)."""


def _count(text: str) -> int | None:
    m = COUNT.match(text)
    if not m:
        return None
    value = float(m.group(1).replace(",", "")) * (1024 if m.group(2) else 1)  # "1k" prompts are 1024 tokens
    return int(value) if value == int(value) and value >= 1 else None


def uniform_bins(lo: int, hi: int, bins: int = UNIFORM_BINS) -> tuple[tuple[int, float], ...]:
    """Lengths drawn uniformly from lo..hi inclusive (vLLM v0.11.0 vllm/benchmarks/datasets.py ``RandomDataset``:
    ``rng.integers(floor(L (1 - r)), ceil(L (1 + r)) + 1)``), as equal-width bins at their midpoints."""
    n = min(bins, hi - lo + 1)
    width = (hi - lo + 1) / n
    return tuple((int(round(lo + (i + 0.5) * width - 0.5)), 1.0 / n) for i in range(n))


def length_bins(text: str, where: str) -> tuple[tuple[int, float], ...] | None:
    """(length, weight) bins of a length cell, or None where it names a catalog dataset (the caller takes the
    dataset's own prompts and replies together)."""
    if catalog.dataset_for(text) is not None:
        return None
    t = re.sub(r"\([^)]*\)", "", text).strip().lower()  # "512 (fixed)": a parenthesised detail
    t = re.sub(r"\s*tokens?$", "", t).lstrip("~≈ ").strip()
    n = _count(t)
    if n is not None:
        return ((n, 1.0),)
    m = RANGE.match(t)
    lo, hi = (_count(m.group(1).strip()), _count(m.group(2).strip())) if m else (None, None)
    if lo is not None and hi is not None and lo < hi:
        return uniform_bins(lo, hi)
    raise SpecError(where, text.strip(), "must be a whole number of tokens (1024, 1,024, 1k, ~1000), a range lo-hi "
                    "of lengths drawn uniformly, or a dataset of catalog/datasets "
                    f"({', '.join(catalog.dataset_names())})")


STATISTIC = re.compile(r"\b(?:(medians?|p50)|(means?|average|avg)|p(\d{2}(?:\.\d+)?)|(\d{2})(?:th)? percentile)\b")
"""A latency statistic a row's unit or notes name: the median (``medians``, ``p50``), the mean (``average``), or a
percentile (``p90``, ``p99``, ``99th percentile``)."""


def row_statistic(row: dict) -> float | None:
    """The statistic the row's ``unit`` and ``notes`` say its latency is (INFERENCE.md: conventions that change the
    number are in the notes): 0 for the mean, q for the q-quantile; None when they name none, or several (a note
    that quotes a p99 constraint beside a mean is not read as either)."""
    text = f"{row.get('unit') or ''} {row.get('notes') or ''}".lower()
    found = set()
    for m in STATISTIC.finditer(text):
        median, mean, p, nth = m.groups()
        pct = p or nth
        found.add(0.5 if median else 0.0 if mean else float(pct) / 100)
    found.discard(1.0)
    return found.pop() if len(found) == 1 and 0 <= min(found) < 1 else None
