"""A step's sample tables at a sink: every process's pre-selected rows merged into one exact
selection per table (``metrics.samples.reselect``), bounded.

A table keeps at most 2k rows however many processes send theirs, so its memory is bounded
by k and the row size; a step's tables are bounded in number (``max_tables``) and in the
characters their rows hold (``max_chars``). Rows beyond either are refused with the reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ...metrics.samples import Kept, reselect
from ...otlp.samples import SampleRow
from ..checked import Process
from ..views.step import entry


def row_chars(row: dict[str, Any]) -> int:
    """What a row costs to hold, roughly: its text plus a word per field."""
    return sum(len(v) for v in row.values() if isinstance(v, str)) + 16 * len(row)


@dataclass(slots=True)
class SampleTable:
    rank_by: str | None
    k: int
    kept: list[Kept] = field(default_factory=list)
    """Each kept row once; ``origin`` is (process, ``SampleRow``)."""
    chars: int = 0
    changed: bool = False
    """Rows came since the table was last viewed."""


def take(
    tables: dict[str, SampleTable], process: Process, rows: Iterable[SampleRow], max_tables: int, max_chars: int
) -> list[tuple[int, str]]:
    """Merge ``process``'s rows into a step's ``tables``; returns (count, why) of what was refused.

    A row this table already keeps from the same process (same ``seq``: a client's retry) is not
    kept twice; one it evicted before would be evicted again. The character bound applies to what
    the merge keeps, so a better row displaces a worse one instead of being refused."""
    refused: list[tuple[int, str]] = []
    groups: dict[str, list[SampleRow]] = {}
    for row in rows:
        groups.setdefault(row.table, []).append(row)
    held = sum(t.chars for t in tables.values())
    for name, group in groups.items():
        table = tables.get(name)
        if table is None:
            if len(tables) >= max_tables:
                refused.append((len(group), f"sample table {name[:64]!r}: the step has {max_tables} tables (limit)"))
                continue
            table = tables[name] = SampleTable(group[0].rank_by, group[0].k)
        fits = [r for r in group if (r.rank_by, r.k) == (table.rank_by, table.k)]
        if len(fits) < len(group):
            why = f"sample table {name[:64]!r} selects by rank_by={table.rank_by!r}, k={table.k}, not as these rows"
            refused.append((len(group) - len(fits), why))
        kept_here = {(k.origin[0].id, k.seq) for k in table.kept}
        new = [Kept(r.key, r.seq, r.side, r.row, (process, r)) for r in fits if (process.id, r.seq) not in kept_here]
        if new:
            chosen = reselect(table.kept + new, table.rank_by, table.k)
            chars = sum(row_chars(k.row) for k in chosen)
            if held - table.chars + chars > max_chars:
                why = f"sample table {name[:64]!r}: the step's rows hold {max_chars} characters (limit)"
                refused.append((len(new), why))
            else:
                held += chars - table.chars
                table.kept, table.chars, table.changed = chosen, chars, True
        if not table.kept and not table.changed:
            del tables[name]
    return refused


def entries(tables: dict[str, SampleTable], step: int, changed_only: bool = False) -> dict[str, list[dict[str, Any]]]:
    """Each table's kept rows as ``sample_entry`` dicts (top rows best first, then bottom worst first)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for name, table in tables.items():
        if changed_only and not table.changed:
            continue
        table.changed = False
        out[name] = [entry(name, step, kept.side, kept.origin) for kept in table.kept]
    return out
