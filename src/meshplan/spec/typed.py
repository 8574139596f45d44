"""Typed reading of values from user files (cluster, GPU, model, plan files, Hugging Face configs): one place that
says what kind of value a field takes and refuses anything else in one line naming the field. A bool is never a
number, NaN and infinities are never numbers, and a float is never a whole number."""

from __future__ import annotations

import math
from typing import Any

from meshplan.errors import SpecError

KINDS = {"whole": "must be a whole number", "int": "must be a whole number >= 1",
         "count": "must be a whole number >= 0", "num": "must be a finite number",
         "pos": "must be a finite number > 0", "nonneg": "must be a finite number >= 0", "str": "must be a string",
         "bool": "must be true or false", "table": "must be a table of key = value", "array": "must be an array [...]"}
"""What each kind of value must be, as the error says it."""
REQUIRED = object()
"""``value_of``'s default: the key must be present."""


def fits(value: Any, kind: str) -> bool:
    """``value`` is of ``kind`` (a key of ``KINDS``); a bool is never a number."""
    if kind in ("str", "bool", "table", "array"):
        return isinstance(value, {"str": str, "bool": bool, "table": dict, "array": (list, tuple)}[kind])
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if kind in ("whole", "int", "count"):
        return isinstance(value, int) and value >= {"whole": value, "int": 1, "count": 0}[kind]
    try:
        x = float(value)
    except OverflowError:  # an integer beyond a float's range
        return False
    return math.isfinite(x) and (kind == "num" or x > 0 or (kind == "nonneg" and x == 0))


def typed(value: Any, where: str, kind: str) -> Any:
    """``value`` unchanged if it is of ``kind`` (a key of ``KINDS``), else a SpecError naming ``where``."""
    if not fits(value, kind):
        raise SpecError(where, value, KINDS[kind])
    return value


def value_of(d: dict, key: str, where: str, kind: str, default: Any = REQUIRED) -> Any:
    """``d[key]`` checked by ``typed`` as ``where.key``; ``default`` where absent (required without one)."""
    if key not in d:
        if default is REQUIRED:
            raise SpecError(f"{where}.{key}", None, "is required")
        return default
    return typed(d[key], f"{where}.{key}", kind)
