"""Sample tables: which rows of a step to keep, exactly and mergeably across processes.

A researcher asks "which rollouts had the best and the worst reward this step, across every
generator?" or "show me a fair handful of this step's rows". Both answers merge exactly
from per-process pre-selections, so a process never sends more than 2k rows per table per
step, whatever it recorded:

* ``rank_by`` a numeric field: the k rows with the highest value and the k with the lowest.
  The global top k is the top k of the processes' top k's (likewise the bottom): exact. A NaN
  ranks above everything at both ends (it is what one wants to see), ties go to the earlier row.
* no ``rank_by``: a uniform random sample of k rows. Each row draws a priority uniform in
  [0, 1); the k highest priorities of all rows are a uniform sample without replacement
  (reservoir sampling by random keys, Efraimidis and Spirakis), and the k highest of the
  processes' k highest are the k highest overall: mergeable, exactly.

Rows are flat mappings of str to str, int, float or bool (``check_row``; long strings are cut
with a visible mark). The SDK pre-selects (``TableSample``), a sink merges (``merge``).
"""

from __future__ import annotations

import heapq
import numbers
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

Row = dict[str, str | int | float | bool]
MAX_TEXT_CHARS = 4096
"""Characters of one string field, a cut one's mark (``…[N more characters]``) included."""
MAX_FIELDS = 64
MAX_K = 1024
MAX_TABLES = 64
"""Sample tables one process may name (a sink's step holds as many, ``SinkConfig.max_sample_tables``)."""
SIDES = ("top", "bottom", "both", "sample", "stream")
"""Why a row travels: kept at the top, the bottom or both ends, in the random sample, or streamed
(every row, for ``per_rank_no_reduce`` views)."""


@dataclass(frozen=True, slots=True)
class Provenance:
    """What a row is stamped with where it is recorded (the sink adds step, role, replica, rank)."""

    time_unix_nano: int
    trace_id: int = 0
    span_id: int = 0
    policy_version: int | None = None


def check_row(table: str, row: Any, max_chars: int = MAX_TEXT_CHARS) -> Row:
    """``row`` as a checked flat row, or TypeError/ValueError naming ``table`` and the field."""
    if not isinstance(table, str) or not table:
        raise TypeError(f"record_sample: the table name must be a non-empty str, got {table!r}")
    if not isinstance(row, Mapping):
        raise TypeError(
            f"record_sample({table!r}): row must be a mapping of str to str/int/float/bool, got {type(row).__name__}"
        )
    if len(row) > MAX_FIELDS:
        raise ValueError(f"record_sample({table!r}): {len(row)} fields (limit {MAX_FIELDS})")
    out: Row = {}
    for key, value in row.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"record_sample({table!r}): field names must be non-empty str, got {key!r}")
        if isinstance(value, str):
            if len(value) > max_chars:  # the mark included, it still fits (a sink does not cut it again)
                keep = max(0, max_chars - len(f"…[{len(value)} more characters]"))
                value = f"{value[:keep]}…[{len(value) - keep} more characters]"
        elif type(value) is not bool and type(value) is not float:
            if isinstance(value, numbers.Integral):  # numpy ints too
                value = int(value)
                if not -(2**63) <= value < 2**63:
                    raise ValueError(f"record_sample({table!r}): field {key!r} is outside int64; record a float")
            elif isinstance(value, numbers.Real):
                value = float(value)
            else:
                kind = type(value).__name__
                raise TypeError(
                    f"record_sample({table!r}): field {key!r} is a {kind}; rows hold str, int, float or bool"
                )
        out[key] = value
    return out


def check_selection(table: str, rank_by: str | None, k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise ValueError(f"record_sample({table!r}): k must be an int in [1, {MAX_K}], got {k!r}")
    if rank_by is not None and (not isinstance(rank_by, str) or not rank_by):
        raise TypeError(f"record_sample({table!r}): rank_by must be a field name or None, got {rank_by!r}")


@dataclass(order=True, slots=True)
class Kept:
    """A kept row: its ranking ``key`` (the ``rank_by`` value, or its random priority), the order it
    came in (``seq``: ties go to the earlier row) and which end it was kept for."""

    key: float
    seq: int
    side: str = field(compare=False)
    row: Row = field(compare=False)
    origin: Any = field(default=None, compare=False)
    """Where the row came from (the SDK: its ``Provenance``; a sink: its process and provenance)."""


def _order(value: float) -> tuple[int, float]:
    """Ranking of a value at the top end: NaN above everything."""
    return (1, 0.0) if value != value else (0, value)


class TableSample:
    """One table's pre-selection of one step in one process: at most 2k rows kept, whatever came."""

    __slots__ = ("_bottom", "_count", "_rng", "_top", "k", "rank_by", "table")

    def __init__(self, table: str, rank_by: str | None, k: int, rng: random.Random | None = None) -> None:
        check_selection(table, rank_by, k)
        self.table, self.rank_by, self.k = table, rank_by, k
        self._rng = rng or random.Random()
        self._top: list[tuple[tuple[int, float], int, Kept]] = []
        """Min-heap of the k best rows at the top (their order, negated seq)."""
        self._bottom: list[tuple[tuple[int, float], int, Kept]] = []
        self._count = 0

    @property
    def recorded(self) -> int:
        """Rows offered, kept or not."""
        return self._count

    def add(self, row: Row, origin: Any = None) -> None:
        """Offer one checked row (``check_row``); raises ValueError if ``rank_by`` is not a number in it."""
        seq = self._count
        if self.rank_by is None:
            priority = self._rng.random()
            self._count += 1
            _push(self._top, ((0, priority), -seq, Kept(priority, seq, "sample", row, origin)), self.k)
            return
        value = row.get(self.rank_by)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(
                f"record_sample({self.table!r}): rank_by field {self.rank_by!r} must be a number in the row"
            )
        self._count += 1
        value = float(value)
        _push(self._top, (_order(value), -seq, Kept(value, seq, "top", row, origin)), self.k)
        low = (1, 0.0) if value != value else (0, -value)
        _push(self._bottom, (low, -seq, Kept(value, seq, "bottom", row, origin)), self.k)

    def kept(self) -> list[Kept]:
        """The kept rows: the top k (best first) then the bottom k (worst first), or the sample."""
        top = [entry[2] for entry in sorted(self._top, reverse=True)]
        bottom = [entry[2] for entry in sorted(self._bottom, reverse=True)]
        return top + bottom

    def distinct(self) -> list[Kept]:
        """``kept`` with a row kept at both ends sent once, as side ``both`` (what goes on the wire)."""
        kept = self.kept()
        ends: dict[int, Kept] = {}
        for entry in kept:
            found = ends.get(entry.seq)
            if found is None:
                ends[entry.seq] = entry
            else:
                found.side = "both"
        return list(ends.values())


def _push(heap: list[Any], entry: tuple[Any, ...], k: int) -> None:
    if len(heap) < k:
        heapq.heappush(heap, entry)
    elif entry[:2] > heap[0][:2]:
        heapq.heapreplace(heap, entry)


_TOP, _BOTTOM = frozenset(("top", "both")), frozenset(("bottom", "both"))


def _ends(rows: list[Kept], k: int) -> tuple[list[Kept], list[Kept]]:
    top = sorted((r for r in rows if r.side in _TOP), key=lambda r: (_order(r.key), -r.seq), reverse=True)[:k]
    bottom = sorted(
        (r for r in rows if r.side in _BOTTOM),
        key=lambda r: ((1, 0.0) if r.key != r.key else (0, -r.key), -r.seq),
        reverse=True,
    )[:k]
    return top, bottom


def merge(kept: Iterable[Kept], rank_by: str | None, k: int) -> list[Kept]:
    """The step's rows across processes from their pre-selections (``TableSample.kept``, each row
    tagged with its process's order in ``seq``): the global top k and bottom k, or the k rows of
    highest priority. Exact: the same rows as one ``TableSample`` over all rows would keep."""
    rows = list(kept)
    if rank_by is None:
        return sorted((r for r in rows if r.side == "sample"), key=lambda r: (r.key, -r.seq), reverse=True)[:k]
    top, bottom = _ends(rows, k)
    return top + bottom


def reselect(kept: Iterable[Kept], rank_by: str | None, k: int) -> list[Kept]:
    """``merge``, each kept row once (side ``both`` when it is kept at both ends): a running
    selection that more pre-selections can be merged into."""
    rows = list(kept)
    if rank_by is None:
        return merge(rows, None, k)
    top, bottom = _ends(rows, k)
    high = {id(r) for r in top}
    low = {id(r) for r in bottom}
    out: list[Kept] = []
    for r in top + [r for r in bottom if id(r) not in high]:
        side = "both" if id(r) in high and id(r) in low else ("top" if id(r) in high else "bottom")
        out.append(r if r.side == side else replace(r, side=side))
    return out
