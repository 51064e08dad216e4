"""Plain OpenTelemetry points of one experiment into per-step rows: the stateful half of the rules.

``otlp.foreign`` reads a point into a row; here a stream (one process's series of one metric)
is followed across requests, so that every row that reaches a step is that step's share:

* a cumulative monotonic Sum becomes the increase since the stream's previous point (its
  first point, or one after a reset — a new start time or a lower value — counts whole, as
  the stream started at zero at its start time) → a SUM row;
* a cumulative Histogram or ExponentialHistogram likewise becomes its buckets' increase;
* a delta non-monotonic Sum is added up into the stream's current value; that value, a
  cumulative non-monotonic Sum's value, and a Gauge's value are LAST-per-stream rows.

A cumulative point no newer than its stream's last one (a retry, a Collector queue that
reorders) is skipped and counted (``stale``): it was counted already. A NaN never becomes a
stream's baseline.

Series per metric name are capped (``max_series``), and series of all names together
(``max_total_series``): past either, new series fold into ``name{otel.metric.overflow=true}``
(the OTel SDK's own overflow series) and are counted. What streams hold is bounded by
``max_stream_cost`` (a stream costs 1 plus its buckets): the least recently updated go first,
counted in ``forgotten`` (such a stream's next point counts whole, as a new stream's).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ..checked import PlainPoint, StateRows
from .merge import OTEL_EXPONENTIAL, OTEL_GAUGE, OTEL_HISTOGRAM, OTEL_UPDOWN

OVERFLOW = "otel.metric.overflow=true"


class Streams:
    """One experiment's plain-OTel streams. Not thread-safe: the experiment's owner holds it."""

    def __init__(
        self, *, max_series: int = 256, max_total_series: int = 100_000, max_stream_cost: int = 4_000_000
    ) -> None:
        self.max_series = max_series
        self.max_total_series = max_total_series
        self.max_stream_cost = max_stream_cost
        self._last: OrderedDict[tuple[str, str, str], tuple[int, int, Any, int]] = OrderedDict()
        """stream -> (start time, time, its last row or value, its cost)."""
        self._cost = 0
        self._series: dict[str, set[str]] = {}
        self._total_series = 0
        self.overflowed = 0
        """Points whose series went past a cap (folded into the overflow series)."""
        self.stale = 0
        """Cumulative points no newer than their stream's last one: skipped."""
        self.forgotten = 0
        """Streams forgotten to stay within ``max_stream_cost``."""

    def convert(self, process_id: str, point: PlainPoint) -> tuple[str, str, tuple[Any, ...]] | None:
        """(reduce, key, row) of one checked point of ``process_id``, or None for a histogram that
        did not grow (an unchanged counter gives a zero increase: a value of its step)."""
        name, series, form, row, start, time_unix_nano, _ = point
        series = self._capped(name, series)
        kind, _, temporality = form.partition(".")
        if kind == "gauge":
            return OTEL_GAUGE, series, (row[0], time_unix_nano)
        if temporality == "delta" and kind != "updown":
            if kind == "counter":
                return "sum", series, row
            return (OTEL_HISTOGRAM if kind == "histogram" else OTEL_EXPONENTIAL), series, row
        stream = (process_id, series, form)
        held = self._last.get(stream)
        if held is not None and temporality == "cumulative":
            if held[0] != start:
                held = None  # a new start time: the stream restarted
            elif time_unix_nano <= held[1]:
                self.stale += 1  # a retry or a reordered point: counted already
                return None
        if kind == "updown":
            value = row[0] if temporality == "cumulative" else (held[2] if held is not None else 0) + row[0]
            if value == value:
                self._keep(stream, start, time_unix_nano, value, 1)
            return OTEL_UPDOWN, series, (value, time_unix_nano)
        before = held[2] if held is not None else None
        if kind == "counter":
            if row[0] == row[0]:  # a NaN is passed on, never a baseline
                self._keep(stream, start, time_unix_nano, row, 1)
            increase = row[0] - before[0] if before is not None and row[0] >= before[0] else row[0]
            return "sum", series, (increase,)
        if kind == "histogram":
            self._keep(stream, start, time_unix_nano, row, 1 + len(row[1]))
            grown = _histogram_increase(row, before)
            return (OTEL_HISTOGRAM, series, grown) if grown[2] else None
        state = row[0]
        self._keep(stream, start, time_unix_nano, row, 1 + len(state["positive"]) + len(state["negative"]))
        state = _exponential_increase(state, before[0] if before is not None else None)
        return (OTEL_EXPONENTIAL, series, (state,)) if state["count"] else None

    def rows(self, process_id: str, points: list[PlainPoint], step_at: Callable[[int], int]) -> list[StateRows]:
        """``process_id``'s plain points as rows of their steps (a point without a step: ``step_at``
        its time), one ``StateRows`` per (reduce type, step)."""
        groups: dict[tuple[str, int], StateRows] = {}
        convert = self.convert
        for point in points:
            converted = convert(process_id, point)
            if converted is None:
                continue
            reduce, key, row = converted
            step = point.step if point.step is not None else step_at(point.time_unix_nano)
            rows = groups.get((reduce, step))
            if rows is None:
                rows = groups[(reduce, step)] = StateRows(reduce, step)
            rows.keys.append(key)
            rows.rows.append(row)
        return list(groups.values())

    def _capped(self, name: str, series: str) -> str:
        known = self._series.get(name)
        if known is not None and series in known:
            return series
        if (known is None or len(known) < self.max_series) and self._total_series < self.max_total_series:
            self._series.setdefault(name, set()).add(series)
            self._total_series += 1
            return series
        self.overflowed += 1
        return f"{name}{{{OVERFLOW}}}"

    def _keep(self, stream: tuple[str, str, str], start: int, time_unix_nano: int, value: Any, cost: int) -> None:
        held = self._last.pop(stream, None)
        if held is not None:
            self._cost -= held[3]
        self._last[stream] = (start, time_unix_nano, value, cost)
        self._cost += cost
        while self._cost > self.max_stream_cost and len(self._last) > 1:
            _, (_, _, _, dropped) = self._last.popitem(last=False)
            self._cost -= dropped
            self.forgotten += 1


def _histogram_increase(row: tuple[Any, ...], before: tuple[Any, ...] | None) -> tuple[Any, ...]:
    bounds, counts, count, total, _, _ = row
    if before is None or before[0] != bounds or count < before[2] or len(before[1]) != len(counts):
        return row
    grown = tuple(n - m for n, m in zip(counts, before[1], strict=True))
    if any(n < 0 for n in grown):
        return row  # a bucket went down: not the same stream's growth (a reset): taken whole
    return (
        bounds,
        grown,
        count - before[2],
        total - before[3],
        math.nan,  # a cumulative min/max is not the increase's
        math.nan,
    )


def _exponential_increase(state: dict[str, Any], before: dict[str, Any] | None) -> dict[str, Any]:
    if before is None or state["count"] < before["count"] or state["zero_count"] < before["zero_count"]:
        return state
    scale = min(state["scale"], before["scale"])
    now, then = _folded(state, scale), _folded(before, scale)
    sides = {}
    for side in ("positive", "negative"):
        diff = {i: n - then[side].get(i, 0) for i, n in now[side].items()}
        if any(n < 0 for n in diff.values()) or not then[side].keys() <= now[side].keys():
            return state  # not an increase of the same stream (a bucket went down or away): taken whole
        sides[side] = {i: n for i, n in diff.items() if n}
    return {
        "scale": scale,
        "count": state["count"] - before["count"],
        "sum": state["sum"] - before["sum"],
        "zero_count": state["zero_count"] - before["zero_count"],
        "min": math.nan,
        "max": math.nan,
        **sides,
    }


def _folded(state: dict[str, Any], scale: int) -> dict[str, Any]:
    shift = state["scale"] - scale
    if not shift:
        return state
    out: dict[str, Any] = {}
    for side in ("positive", "negative"):
        folded: dict[int, int] = {}
        for index, n in state[side].items():
            folded[index >> shift] = folded.get(index >> shift, 0) + n
        out[side] = folded
    return out
