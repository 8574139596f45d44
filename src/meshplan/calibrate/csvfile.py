"""Reading a validation CSV: its path checked, its header sniffed, its rows as stripped dicts with the reason a row
cannot be read (one home for the runs, long-sequence and serving loaders)."""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Iterator

from meshplan.errors import SpecError, shown
from meshplan.spec.io import existing_file


def csv_path(path: str | Path) -> Path:
    """``path`` as a CSV file to read, or a one-line error: empty, a folder, missing, not a regular file."""
    return existing_file(path, "CSV")


def column_name(text: str) -> str:
    """A header cell as the loaders name columns: ``Model Key``, ``model-key`` and ``MODEL_KEY`` are ``model_key``
    (a blank one stays as written: no loader reads it)."""
    return "_".join(text.strip().lower().replace("-", " ").split()) or text


DECIMAL_COMMA = re.compile(r"^([~≈]?\s*-?\d+),(\d+)(\s*[a-z/%]*)$", re.IGNORECASE)
"""A number written with a decimal comma (``154,960``, ``0,123 s``): what a ``;``-separated file from a locale
whose decimal mark is a comma holds (its thousands, if marked, are dots or spaces)."""


def _decimal_points(row: dict) -> dict:
    """``row`` with every decimal comma of a ``;``-separated file read as a point."""
    return {k: DECIMAL_COMMA.sub(r"\1.\2\3", v) if isinstance(v, str) else v for k, v in row.items()}


def _delimiter(first: str) -> str:
    """The cell separator of a CSV from its header line: a comma, else a semicolon or tab where the header uses
    one and no comma (spreadsheets in locales whose decimal mark is a comma write ``;``)."""
    if "," in first:
        return ","
    return next((d for d in (";", "\t") if d in first), ",")


def csv_rows(path: str | Path, check_header) -> Iterator[tuple[int, dict, str]]:
    """The data rows of a CSV as (line, row, why), every cell of the row stripped of surrounding blanks; ``why``
    is empty, or says why the row cannot be read (more cells than the header names, unless the last column is the
    free-text ``notes``, which an unquoted comma splits and which takes them back: the caller skips it).
    ``check_header(fieldnames)`` refuses a header first; one naming a column twice is refused here. Read as UTF-8,
    a leading byte-order mark dropped; column names as ``column_name`` spells them, cells split at ``_delimiter``."""
    p = csv_path(path)
    try:
        with p.open(newline="", encoding="utf-8-sig") as fh:
            delimiter = _delimiter(fh.readline())
            fh.seek(0)
            reader = csv.DictReader(fh, delimiter=delimiter)
            if reader.fieldnames:
                reader.fieldnames = [column_name(c) for c in reader.fieldnames]
            header = list(reader.fieldnames or ())
            dup = next((c for i, c in enumerate(header) if c in header[:i]), None)
            if dup is not None:
                raise SpecError("file", str(p), f"names column {dup!r} twice in its header: which cell counts is "
                                "ambiguous; keep one")
            check_header(reader.fieldnames)
            for row in reader:
                extra = row.pop(None, None)  # DictReader's restkey: cells beyond the header
                row = {k: v.strip() if isinstance(v, str) else v for k, v in row.items()}
                if delimiter == ";":
                    row = _decimal_points(row)
                why = ""
                if extra is not None and header[-1] == "notes":  # an unquoted comma in the free-text notes
                    row["notes"] = ",".join([row.get("notes") or "", *extra]).strip()
                elif extra is not None:
                    rid = row.get("id") or f"line {reader.line_num}"
                    why = str(SpecError(f"{rid}.cells", len(header) + len(extra), f"line {reader.line_num} has more "
                                        f"cells than the {len(header)} columns its header names (a stray comma or "
                                        f"a value without a column: {shown(extra)})"))
                yield reader.line_num, row, why
    except (UnicodeDecodeError, csv.Error) as exc:
        raise SpecError("file", str(p), f"is not a readable CSV ({exc})") from None


def csv_header(path: str | Path) -> list[str] | None:
    """The header row of a CSV file (None when it is empty or unreadable: ``csv_rows`` then says why)."""
    try:
        with csv_path(path).open(newline="", encoding="utf-8-sig") as fh:
            delimiter = _delimiter(fh.readline())
            fh.seek(0)
            header = next(csv.reader(fh, delimiter=delimiter), None)
            return None if header is None else [column_name(c) for c in header]
    except (UnicodeDecodeError, csv.Error):
        return None
