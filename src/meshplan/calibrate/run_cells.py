"""Reading one cell of a published-run row as sources write it: whole numbers, ZeRO stages ("ZeRO-1",
"3 (FSDP)"), yes/no flags, numbers stated in the free-text notes."""

from __future__ import annotations

import re

from meshplan.errors import SpecError


def whole(row: dict, key: str, default: int | None = None) -> int:
    """A whole number (``1024``, ``1024.0``); empty takes ``default``, or is refused when there is none."""
    v = (row.get(key) or "").strip()
    if not v:
        if default is None:
            raise SpecError(key, v, "is empty and has no default")
        return default
    try:
        x = float(v)
    except ValueError:
        raise SpecError(key, v, "must be a whole number") from None
    if not x.is_integer():
        raise SpecError(key, v, "must be a whole number")
    return int(x)


def zero_stage(row: dict) -> int:
    """The ZeRO stage as sources write it: ``1``, ``ZeRO-1``, ``zero3``, ``3 (FSDP)``."""
    text = (row.get("zero") or "").strip().lower()
    m = re.fullmatch(r"(?:zero[-_ ]?)?(\d)(?:\s*\(.*\))?", text)
    return int(m.group(1)) if m else whole(row, "zero", 0)


FLAG_WORDS = {"yes": 1, "y": 1, "true": 1, "on": 1, "no": 0, "n": 0, "false": 0, "off": 0}


def flag(row: dict, key: str) -> int:
    """A 0/1 column as sources write it (``yes``, ``True``, ``0``); empty is 0."""
    word = (row.get(key) or "").strip().lower()
    return FLAG_WORDS[word] if word in FLAG_WORDS else whole(row, key, 0)


def note_int(notes: str, pattern: str, default: int = 0) -> int:
    """The number ``pattern``'s first group finds in the notes (a stated 0 included), or ``default``."""
    m = re.search(pattern, notes, flags=re.IGNORECASE)
    return int(m.group(1)) if m else default
