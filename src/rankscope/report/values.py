"""What every part of the summary does with a value from ``report.jsonl``: the file holds names
and values a client chose, so a value is kept bounded (``text``), finite (``number``) or not at
all; a ``snapshot`` is checked strictly (``strict`` and the rest raise ``ValueError``), since
taking it replaces the whole summary and a malformed one must change nothing."""

from __future__ import annotations

import json
import math
from typing import Any
from urllib.parse import quote

MAX_LISTED = 500
"""Entries of a list the page shows whole (rewinds, missing processes, late steps), and of a
snapshot's lists with no bound of their own."""
TEXT = 500
"""Characters of a sample cell or name kept for the page."""


def number(value: Any) -> float | None:
    """A finite float, else None (a gap in a chart; the anomalies name non-finite values)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def text(value: Any) -> str:
    found = value if isinstance(value, str) else json.dumps(value, default=str)
    return found if len(found) <= TEXT else found[: TEXT - 1] + "…"


def integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def cell(value: Any) -> Any:
    """A table cell: None, a bool, a finite number, else text (``inf`` as ``"inf"``)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value if math.isfinite(value) else str(value)
    return text(value)


# -- a snapshot's values: anything else, the snapshot is malformed


def strict(value: Any, least: int | None = None) -> int:
    """An int (at least ``least``)."""
    found = integer(value)
    if found is None or (least is not None and found < least):
        raise ValueError("int")
    return found


def optional(value: Any) -> int | None:
    return None if value is None else strict(value)


def string(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("str")
    return value


def listed(value: Any, most: int = MAX_LISTED) -> list[Any]:
    if not isinstance(value, list) or len(value) > most:
        raise ValueError("list")
    return value


def mapping(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError("dict")
    return value


def relative_link(path: Any) -> str | None:
    """An ``href`` a page may write for a path on disk beside it: each part URL-quoted, so no part
    can be read as a scheme (``javascript:...``), a query or a fragment; None for anything but a
    relative path (absolute, ``//host``, empty, not text, longer than ``TEXT``)."""
    if not isinstance(path, str) or not path or len(path) > TEXT or path.startswith(("/", "\\")):
        return None
    parts = path.replace("\\", "/").split("/")
    if any(not part for part in parts):
        return None
    return "/".join(quote(part, safe="") for part in parts)
