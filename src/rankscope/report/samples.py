"""The sample tables (``samples`` events): per table, the rows of its last ``SAMPLE_STEPS``
steps with their provenance. Bounded however many tables and rows a client logs: at most
``MAX_TABLES`` tables (more are counted), ``MAX_ROWS`` rows a step, 32 cells a row."""

from __future__ import annotations

from collections import deque
from typing import Any

from .values import cell, integer, listed, mapping, optional, strict, text

SAMPLE_STEPS = 8
MAX_TABLES = 16
MAX_ROWS = 64


class Samples:
    """The sample tables (module docstring)."""

    def __init__(self) -> None:
        self.tables: dict[str, deque[dict[str, Any]]] = {}
        self.not_shown = 0
        """Events of tables past ``MAX_TABLES``, counted."""

    def add(self, event: dict[str, Any]) -> None:
        table, step = text(event["table"])[:128], integer(event.get("step"))
        if table not in self.tables:
            if len(self.tables) >= MAX_TABLES:
                self.not_shown += 1
                return
            self.tables[table] = deque(maxlen=SAMPLE_STEPS)
        rows = [_sample_row(r) for r in event["rows"] if isinstance(r, dict)][:MAX_ROWS]
        kept = self.tables[table]
        if kept and kept[-1]["step"] == step:  # a late update of the same step replaces it
            kept.pop()
        kept.append({"step": step, "late": bool(event.get("late")), "rows": rows})

    def drop_from(self, step: int) -> None:
        """A rewind: the rows of ``step`` and later go (rows with no step stay)."""
        for table, kept in self.tables.items():
            self.tables[table] = deque((e for e in kept if e["step"] is None or e["step"] < step), maxlen=SAMPLE_STEPS)

    def state(self) -> dict[str, Any]:
        """This part of a ``snapshot`` event."""
        return {
            "samples": [{"table": t, "steps": list(kept)} for t, kept in self.tables.items()],
            "tables_not_shown": self.not_shown,
        }

    def data(self) -> dict[str, Any]:
        """This part of the page's data: all it keeps, as a snapshot holds it."""
        return self.state()

    @classmethod
    def restore(cls, event: dict[str, Any]) -> Samples:
        """The part a snapshot holds, checked (``ValueError``: malformed)."""
        new = cls()
        for table in listed(event["samples"], MAX_TABLES):
            new.tables[text(table["table"])[:128]] = deque(
                (
                    {
                        "step": optional(e["step"]),
                        "late": bool(e["late"]),
                        "rows": [_sample_row(mapping(r)) for r in listed(e["rows"], MAX_ROWS)],
                    }
                    for e in listed(table["steps"], SAMPLE_STEPS)
                ),
                maxlen=SAMPLE_STEPS,
            )
        new.not_shown = strict(event["tables_not_shown"])
        return new


def _sample_row(entry: dict[str, Any]) -> dict[str, Any]:
    found = entry.get("row")
    row: dict[str, Any] = found if isinstance(found, dict) else {}
    cells = {str(k)[:64]: cell(v) for k, v in list(row.items())[:32]}
    who = {k: cell(entry.get(k)) for k in ("side", "process", "policy_version", "trace_id")}
    return {"row": cells, **who}
