"""Typed errors for user input, and the typed infeasible result.

Every user-facing failure names the field, the value and what would be valid, so the CLI can print one line
and exit non-zero without a traceback.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Iterable


class MeshplanError(Exception):
    """Base class of every error meshplan reports to a user as a one-line message."""


class SpecError(MeshplanError):
    """A field of a spec (model, cluster, plan, file) holds an invalid value."""

    def __init__(self, field_name: str, value: object, expected: str, suggestions: Iterable[str] = ()):
        self.field = field_name
        self.value = value
        self.expected = expected
        self.suggestions = tuple(suggestions)
        hint = f" (did you mean: {', '.join(self.suggestions)}?)" if self.suggestions else ""
        super().__init__(f"{field_name} = {shown(value)}: {expected}{hint}")


SHOWN_CHARS = 200
"""How much of a value's repr an error line shows (a whole file's table would make a line of 100k characters)."""


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)``, cut to about ``limit`` characters with an ellipsis and the full length when longer."""
    try:
        text = repr(value)
    except ValueError:  # an integer beyond the interpreter's digit limit
        return f"<a whole number of more than {limit} digits>"
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text):,} characters)"


class PlanError(MeshplanError):
    """A plan violates one or more constraints against a model and a cluster; each is listed."""

    def __init__(self, violations: Iterable[str]):
        self.violations = tuple(violations)
        super().__init__("invalid plan: " + "; ".join(self.violations))


def close_matches(name: str, options: Iterable[str], n: int = 3) -> list[str]:
    """Return up to ``n`` options that look like ``name`` (for 'did you mean' hints): those it begins, shortest
    first (``h100`` -> ``h100-sxm``), then difflib's closest, else those it contains or is contained in."""
    opts, low = list(options), name.lower()
    prefixed = sorted((o for o in opts if low and o.lower().startswith(low) and o.lower() != low),
                      key=lambda o: (len(o), o))
    found = prefixed + [o for o in difflib.get_close_matches(low, opts, n=n, cutoff=0.5) if o not in prefixed]
    if not found:
        found = [o for o in opts if low in o or o in low]
    return found[:n]


def unknown_name(kind: str, name: str, options: Iterable[str]) -> SpecError:
    """Build the error for an unknown catalog or registry name, with close matches."""
    opts = sorted(options)
    sugg = close_matches(name, opts)
    listing = ", ".join(opts) if len(opts) <= 12 else ", ".join(opts[:12]) + ", ..."
    return SpecError(kind, name, f"unknown {kind}; known: {listing}", sugg)


@dataclass(frozen=True, kw_only=True)
class Infeasible:
    """A plan that cannot run: the reason is readable and the kind is countable (search prunes by it).

    Attributes:
        kind: short machine-readable reason class, e.g. ``"memory"``, ``"divisibility"``.
        reason: one readable sentence with the numbers behind it.
        details: optional numbers (e.g. memory breakdown in bytes) for reports.
    """

    kind: str
    reason: str
    details: dict = field(default_factory=dict)

    def __str__(self) -> str:
        return f"infeasible ({self.kind}): {self.reason}"
