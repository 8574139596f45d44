"""Cells of a serving CSV as sources write them: lengths (``1024``, ``1,024``, ``1k``, ``~1000``, ``512 (fixed)``, a
range ``512-1536`` drawn uniformly, a catalog dataset's name), the statistic a latency is, the weight format, the
measured value, and the load (clients, a rate, offline, a benchmark scenario)."""

from __future__ import annotations

import re

from meshplan import catalog
from meshplan.errors import SpecError

COUNT = re.compile(r"^(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)\s*(k?)$")
"""A token count: digits with or without thousands separators, or a multiple of 1024 written ``1k``, ``1.5k``."""
RANGE = re.compile(r"^(.+?)\s*(?:-|–|to)\s*(.+)$")
UNIFORM_BINS = 8
"""Equal-width bins of a uniform range (8: its p90 within a sixteenth of the range of the exact one)."""


MAX_TOKENS = 1 << 30
"""Longest length a cell may state (a billion tokens: beyond any context; a longer number is a typo)."""


def _count(text: str) -> int | None:
    m = COUNT.match(text)
    if not m:
        return None
    digits, k = m.group(1).replace(",", ""), m.group(2)
    if len(digits) > 12:
        return None
    value = float(digits) * (1024 if k else 1)  # "1k" prompts are 1024 tokens; "1024.0" is 1024, "1.5" none
    return int(value) if value == int(value) and 1 <= value <= MAX_TOKENS else None


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
    t = re.sub(r"^(?:random|fixed|uniform|avg|average|mean)\b[\s:=_-]*", "", t)  # "random 1024", "Random-1K"
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


STAT = r"(medians?|means?|average|avg|p\d{2}(?:\.\d+)?|\d{2}(?:\.\d+)?(?:th)?[- ]percentile)"
LATENCY = (r"(ttft|tpot|itl|e2el?|latency|latencies|inter-token latency|time to first token|time per output token"
           r"|end-to-end latency)")
_NOT_A_BOUND = r"(?!\s*(?:<|<=|≤|bound|slo|target|limit|constraint))"
NAMED = re.compile(rf"\b{STAT}\s+(?:[\w-]+\s+){{0,2}}?{LATENCY}\b{_NOT_A_BOUND}"
                   rf"|\b{LATENCY}\s*[(:,]?\s*{STAT}\b{_NOT_A_BOUND}"
                   r"|\b(medians)\b")
"""A latency statistic a row's notes name: a statistic beside a latency word ("median TTFT", "p99 latency",
"TTFT (p90)", "99th percentile inter-token latency"), not a bound on it ("p99 TTFT < 2 s"), or the plural
"medians" (SGLang's tables); another quantity's statistic ("median output length") is not read."""
UNIT_STAT = re.compile(rf"\b{STAT}\b")
METRIC_WORDS = {"ttft_ms": ("ttft", "time to first token"), "tpot_ms": ("tpot", "time per output token"),
                "itl_ms": ("itl", "inter-token latency"), "e2e_latency_s": ("e2e", "e2el", "end-to-end latency")}
"""The words that name each latency metric: a statistic named for another metric is not this row's."""


def _value(word: str) -> float | None:
    """0 for a mean, q for a quantile, None for a percentile outside (0, 100)."""
    word = word.lower()
    if word.startswith("median"):
        return 0.5
    if word.startswith(("mean", "average", "avg")):
        return 0.0
    pct = float(re.search(r"\d+(?:\.\d+)?", word).group())
    return pct / 100 if 0 < pct < 100 else None


def row_statistic(row: dict) -> float | None:
    """The statistic the row's ``unit`` or ``notes`` say its latency is (INFERENCE.md: conventions that change the
    number are in the notes): 0 for the mean, q for the q-quantile; None when they name none, or several (a note
    that gives a median beside a mean is not read as either). A statistic named for another metric ("p99 TTFT"
    on an ITL row) is not this row's; one named for latency in general is."""
    found = {_value(m.group(1)) for m in UNIT_STAT.finditer((row.get("unit") or "").lower())}
    others = {w for metric, words in METRIC_WORDS.items() if metric != (row.get("metric") or "").strip()
              for w in words}
    for m in NAMED.finditer((row.get("notes") or "").lower()):
        groups = [g for g in m.groups() if g]
        if any(g in others for g in groups):
            continue
        found.add(_value(next(g for g in groups if re.fullmatch(STAT, g))))
    found.discard(None)
    return found.pop() if len(found) == 1 else None


NOT_STATED = ("n/a", "na", "-", "–", "—", "none", "not stated", "unknown")
"""Cells that say a source gives no value (the column's default applies, as for an empty cell)."""
DEGREE = re.compile(r"^(?:([a-z]+)\s*[=:]?\s*)?(\d+)(?:\.0+)?(?:\s*\((.*)\))?$")
"""A degree as sources write it: ``4``, ``4.0``, ``TP4``, ``tp=4``, ``TP 4``, ``4 (tensor parallel)``."""


DEGREE_WORDS = {"tp": ("tp", "tensor"), "pp": ("pp", "pipeline"), "dp": ("dp", "data"), "ep": ("ep", "expert")}
"""Words that label a degree as one column's (``2 (PP)`` in a tp cell is another column's value)."""


def stated_cell(row: dict, key: str) -> bool:
    """Whether a row's cell states a value (not empty, not ``n/a``)."""
    v = (row.get(key) or "").strip()
    return bool(v) and v.lower() not in NOT_STATED


def whole_cell(row: dict, key: str, default: int) -> int:
    """A whole-number cell of a serving row (a parallel degree, a batch cap): a number, or a number labelled
    with its own column's name (``TP4``, ``tp=4``, ``4 (TP)``); empty or not stated (``n/a``, ``-``) is
    ``default``; anything else is refused."""
    if not stated_cell(row, key):
        return default
    v = row[key].strip()
    m = DEGREE.match(v.lower())
    others = [w for k, words in DEGREE_WORDS.items() if k != key for w in words]
    named = re.findall(r"[a-z]+", m.group(3) or "") if m else []
    if m is None or (m.group(1) and m.group(1) != key.lower()) or any(w in others for w in named):
        raise SpecError(f"{row.get('id', '')}.{key}", v, "must be a whole number (or empty / n/a: not stated)")
    return int(m.group(2))


PRECISION_WORDS = ((r"nvfp4|mxfp4|\bfp4\b", "fp4"), (r"awq|gptq|w4a16|\bint4\b", "int4"), (r"fp8|e4m3", "fp8"))
"""Weight formats anywhere in a precision cell ("fp16 (AWQ)" serves 4-bit weights, "W8A8-FP8" fp8 ones): the
quantized format is what the weights are read in, whatever compute dtype the cell names beside it."""


def weight_format(text: str) -> str | None:
    """The quantized weight format a precision cell names anywhere in it, or None."""
    low = (text or "").lower()
    return next((name for pattern, name in PRECISION_WORDS if re.search(pattern, low)), None)


VALUE = re.compile(r"^[~≈]?\s*(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?(?:e[+-]?\d+)?)\s*(?:[a-z/%]+)?$")
"""A measurement as sources write it: ``1234.5``, ``1,234.5``, ``~120``, ``1.2e3``, ``120 ms`` (the unit the row's
``unit`` column already names)."""


def measured_value(text: str) -> float | None:
    """The number a ``value`` cell states (a parenthesised detail dropped), or None."""
    m = VALUE.match(re.sub(r"\([^)]*\)", "", text or "").strip().lower())
    return float(m.group(1).replace(",", "")) if m else None


OFFLINE = ("max", "offline", "inf", "unlimited", "∞")
"""``concurrency`` words that mean an offline run (every request queued at once)."""
RATE_UNIT = re.compile(r"^(\d+(?:\.\d+)?)\s*(?:qps|rps|req/s|reqs/s|requests/s|requests per second|/s)$"
                       r"|^(?:qps|rps|rate|request rate)\s*[=:]?\s*(\d+(?:\.\d+)?)(?:\s*/s)?$")
"""An open-loop rate in the ``concurrency`` column: ``4 qps``, ``4 req/s``, ``qps=4`` (a parenthesised detail,
"(Poisson)", dropped first)."""
CLIENTS = re.compile(r"^(?:c|n|conc|(?:max(?:imum)?[- _]?)?(?:concurrency|clients|users))\s*[=:]?\s*(\d+)$"
                     r"|^(\d+)\s*(?:concurrent(?:\s+(?:requests|users|clients))?|clients|users|requests in flight)$")
"""A closed loop's clients as other sources write them: ``c=64``, ``concurrency 64``, ``64 concurrent users``."""
OFFLINE_CELL = re.compile(r"^(?:max|maximum|offline|inf|infinite|unlimited|∞)\b\s*(?:\(.*)?$")
"""An offline run's cell: the word alone or with a parenthesised detail ("max (offline)", "inf (5000 prompts)"),
not "max 64" or "max batch 256" (a cap, not a load)."""
OPEN_LOOP = re.compile(r"poisson|open[- ]loop|\bqps\b|request[- _]rate|req/s|requests per second|arrival rate")
"""Notes that say a bare number in ``concurrency`` is a rate (INFERENCE.md: the column holds the QPS of an open-loop
run)."""
NOTES_RATE = re.compile(r"request[- _]rate[\s:=]*(\d+(?:\.\d+)?|inf)\b"
                        r"|(\d+(?:\.\d+)?)\s*(?:qps|req/s|reqs/s|requests/s|requests per second)\b"
                        r"|\bqps[\s:=]*(\d+(?:\.\d+)?)\b")
"""Where ``concurrency`` is empty, INFERENCE.md puts an open loop's rate in ``notes`` ("request rate 4/s")."""
SCENARIOS = ("server", "interactive")
"""``concurrency`` values that name a benchmark's latency-bound scenario ("server (Poisson)"): the rate is the
highest its dataset's constraints allow (``Dataset.scenarios``)."""


def row_load(row: dict) -> dict:
    """The load of a row: closed loop (a number of clients), offline (``max``, ``offline``, ``inf``), an open
    loop (a rate with its unit in ``concurrency``, or, when that is empty, the rate the notes state), or a
    benchmark scenario (its rate is found later: the load here is offline)."""
    conc = (row.get("concurrency") or "").strip().lower()
    bare = conc.split("(", 1)[0].strip().lstrip("-")  # "64 (closed loop)", "4 req/s (Poisson)", "--max-concurrency 64"
    notes = (row.get("notes") or "").lower()
    clients = CLIENTS.match(bare)  # before the offline words: "max-concurrency 16" is 16 clients
    if clients:
        return _load(row, concurrency=int(clients.group(1) or clients.group(2)))
    if OFFLINE_CELL.match(conc) or conc.startswith(SCENARIOS):
        return {}
    if re.fullmatch(r"\d+(?:\.\d+)?", bare) and OPEN_LOOP.search(notes):  # a QPS, as the notes say
        said = NOTES_RATE.search(notes)
        rate = next((g for g in said.groups() if g), bare) if said else bare
        return {} if rate == "inf" else _load(row, rate=float(rate))
    if bare.isdigit() or re.fullmatch(r"\d+\.0+", bare):
        return _load(row, concurrency=int(float(bare)))
    unit = RATE_UNIT.match(bare)
    if unit:
        return _load(row, rate=float(unit.group(1) or unit.group(2)))
    if not conc:
        said = NOTES_RATE.search((row.get("notes") or "").lower())
        if said:
            rate = next(g for g in said.groups() if g)
            return {} if rate == "inf" else {"rate": float(rate)}
    raise SpecError(f"{row['id']}.concurrency", conc, "must be a number of clients, a rate such as '4 qps', or "
                    "an offline run ('max', 'offline'); an empty one needs the rate in the notes")


def _load(row: dict, **load: float) -> dict:
    """A closed or open loop with a load above zero (zero clients or requests/s is no run, not an offline one)."""
    if not next(iter(load.values())) > 0:
        raise SpecError(f"{row['id']}.concurrency", row.get("concurrency", "").strip(),
                        "must be at least one client or a rate above 0 (an offline run: 'max', 'offline')")
    return load
