"""Plain OpenTelemetry points of one experiment into per-step rows: the stateful half of the rules.

``otlp.foreign`` reads a point into a row; here a stream (one process's series of one metric)
is followed across requests, so that every row that reaches a step is that step's share:

* a cumulative monotonic Sum becomes the increase since the stream's previous point (its
  first point, or one after a reset — a new start time or a lower value — counts whole, as
  the stream started at zero at its start time) → a SUM row;
* a cumulative Histogram or ExponentialHistogram likewise becomes its buckets' increase;
* a delta non-monotonic Sum is added up into the stream's current value; that value, a
  cumulative non-monotonic Sum's value, and a Gauge's value are LAST-per-stream rows.

Series per metric name are capped (``max_series``): past it, new series fold into
``name{otel.metric.overflow=true}`` (the OTel SDK's own overflow series) and are counted.
Streams are forgotten oldest first past ``max_streams``.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

from .merge import OTEL_EXPONENTIAL, OTEL_GAUGE, OTEL_HISTOGRAM, OTEL_UPDOWN
from .validate import PlainPoint

OVERFLOW = "otel.metric.overflow=true"


class Streams:
    """One experiment's plain-OTel streams. Not thread-safe: the experiment's owner holds it."""

    def __init__(self, *, max_series: int = 256, max_streams: int = 1_000_000) -> None:
        self.max_series = max_series
        self.max_streams = max_streams
        self._last: OrderedDict[tuple[str, str, str], tuple[int, Any]] = OrderedDict()
        self._series: dict[str, set[str]] = {}
        self.overflowed = 0
        """Points whose series went past the cap (folded into the overflow series)."""

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
        if held is not None and held[0] != start and temporality == "cumulative":
            held = None  # a new start time: the stream restarted
        if kind == "updown":
            value = row[0] if temporality == "cumulative" else (held[1] if held is not None else 0) + row[0]
            self._keep(stream, start, value)
            return OTEL_UPDOWN, series, (value, time_unix_nano)
        self._keep(stream, start, row)
        if kind == "counter":
            increase = row[0] - held[1][0] if held is not None and row[0] >= held[1][0] else row[0]
            return "sum", series, (increase,)
        if kind == "histogram":
            grown = _histogram_increase(row, held[1] if held is not None else None)
            return (OTEL_HISTOGRAM, series, grown) if grown[2] else None
        state = _exponential_increase(row[0], held[1][0] if held is not None else None)
        return (OTEL_EXPONENTIAL, series, (state,)) if state["count"] else None

    def _capped(self, name: str, series: str) -> str:
        known = self._series.setdefault(name, set())
        if series in known:
            return series
        if len(known) < self.max_series:
            known.add(series)
            return series
        self.overflowed += 1
        return f"{name}{{{OVERFLOW}}}"

    def _keep(self, stream: tuple[str, str, str], start: int, value: Any) -> None:
        self._last[stream] = (start, value)
        if len(self._last) > self.max_streams:
            self._last.popitem(last=False)


def _histogram_increase(row: tuple[Any, ...], before: tuple[Any, ...] | None) -> tuple[Any, ...]:
    bounds, counts, count, total, _, _ = row
    if before is None or before[0] != bounds or count < before[2] or len(before[1]) != len(counts):
        return row
    return (
        bounds,
        tuple(n - m for n, m in zip(counts, before[1], strict=True)),
        count - before[2],
        total - before[3],
        math.nan,  # a cumulative min/max is not the increase's
        math.nan,
    )


def _exponential_increase(state: dict[str, Any], before: dict[str, Any] | None) -> dict[str, Any]:
    if before is None or state["count"] < before["count"]:
        return state
    scale = min(state["scale"], before["scale"])
    now, then = _folded(state, scale), _folded(before, scale)
    sides = {}
    for side in ("positive", "negative"):
        diff = {i: n - then[side].get(i, 0) for i, n in now[side].items()}
        if any(n < 0 for n in diff.values()):
            return state  # not an increase of the same stream: take it whole
        sides[side] = {i: n for i, n in diff.items() if n}
    return {
        "scale": scale,
        "count": state["count"] - before["count"],
        "sum": state["sum"] - before["sum"],
        "zero_count": max(0, state["zero_count"] - before["zero_count"]),
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
