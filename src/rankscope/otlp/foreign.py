"""Plain OpenTelemetry metric points (no ``rankscope.reduce``): read into rows, checked, never raising.

Any OTel client (an SDK program, telemetrygen, the Collector's Prometheus receiver) sends
points of the five OTLP kinds. A sink takes them by these rules (the table in ``docs/sink.md``); this
module is the stateless half (``sink.book.streams`` turns cumulative streams into deltas):

==============================  ===========================  ================================
point                           form                          row
==============================  ===========================  ================================
Sum, monotonic                  ``counter``                   (value,)
Sum, not monotonic              ``updown``                    (value,)
Gauge                           ``gauge``                     (value,)
Histogram                       ``histogram``                 (bounds, counts, count, sum, min, max)
ExponentialHistogram            ``exponential``               (state,) as ``metrics.DistributionAccumulator``
Summary                         refused (no mergeable state)
==============================  ===========================  ================================

A form carries its temporality (``counter.delta``, ``counter.cumulative``; a gauge has none).
A point's attributes name its series: ``name{k=v,k2=v2}`` (keys sorted), or ``name`` alone.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Mapping
from typing import Any

from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb

from .metrics import exponential_state

Row = tuple[Any, ...]
MIN_SCALE = -10
"""The coarsest scale of an OTLP ExponentialHistogram (the specification's range is [-10, 20])."""
MAX_BOUNDS = 4096
_NO_RECORDED_VALUE = pb.DATA_POINT_FLAGS_NO_RECORDED_VALUE_MASK
_CUMULATIVE = pb.AGGREGATION_TEMPORALITY_CUMULATIVE
_DELTA = pb.AGGREGATION_TEMPORALITY_DELTA
_MAX_SERIES_CHARS = 1024


def series_name(name: str, point_attributes: Mapping[str, Any]) -> str:
    """``name{k=v,...}``: the series a point's attributes name (sorted keys; a long value or list
    is cut and marked with a hash of the whole, so distinct series stay distinct)."""
    if not point_attributes:
        return name
    inner = ",".join(f"{k}={_text(str(v), 128)}" for k, v in sorted(point_attributes.items()))
    return f"{name}{{{_text(inner, _MAX_SERIES_CHARS)}}}"


def _text(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…{hashlib.blake2b(text.encode(), digest_size=5).hexdigest()}"


FORMS = frozenset(
    f"{kind}.{temporality}"
    for kind in ("counter", "updown", "histogram", "exponential")
    for temporality in ("delta", "cumulative")
) | {"gauge"}


def form_of(kind: str, data: Any) -> str:
    """The form (with temporality) of a metric's data field (one of ``FORMS``), or why its points are refused."""
    if kind == "gauge":
        return "gauge"
    if kind == "summary":
        return "Summary points are not taken (no mergeable state: export a Histogram instead)"
    temporality = data.aggregation_temporality
    if temporality not in (_CUMULATIVE, _DELTA):
        return "aggregation temporality unspecified"
    suffix = ".cumulative" if temporality == _CUMULATIVE else ".delta"
    if kind == "sum":
        return ("counter" if data.is_monotonic else "updown") + suffix
    if kind == "histogram":
        return "histogram" + suffix
    if kind == "exponential_histogram":
        return "exponential" + suffix
    return f"unknown point kind {kind!r}"


def read(form: str, p: Any, max_buckets: int) -> Row | str | None:
    """A point's row, why it is refused, or None for a point without a value (a staleness marker)."""
    if p.flags & _NO_RECORDED_VALUE:
        return None
    if form.startswith("histogram"):
        return _histogram(p, max_buckets)
    if form.startswith("exponential"):
        return _exponential(p, max_buckets)
    value = p.as_double if p.WhichOneof("value") == "as_double" else p.as_int
    if form.startswith("counter") and value < 0:
        return "a monotonic Sum cannot be negative"
    return (value,)


def _histogram(p: Any, max_buckets: int) -> Row | str:
    bounds = tuple(p.explicit_bounds)
    counts = tuple(p.bucket_counts)
    if len(bounds) > min(max_buckets, MAX_BOUNDS):
        return f"{len(bounds)} histogram bounds (limit {min(max_buckets, MAX_BOUNDS)})"
    if counts and len(counts) != len(bounds) + 1:
        return f"{len(counts)} bucket counts for {len(bounds)} bounds"
    if any(not math.isfinite(b) for b in bounds) or any(a >= b for a, b in itertools.pairwise(bounds)):
        return "histogram bounds must be finite and increasing"
    if sum(counts) > p.count:
        return f"buckets hold {sum(counts)} values but count is {p.count}"
    low = p.min if p.HasField("min") else math.nan
    high = p.max if p.HasField("max") else math.nan
    return (bounds, counts, p.count, p.sum, low, high)


def _exponential(p: Any, max_buckets: int) -> Row | str:
    state = exponential_state(p, MIN_SCALE, max_buckets, absent=math.nan)
    return state if isinstance(state, str) else (state,)
