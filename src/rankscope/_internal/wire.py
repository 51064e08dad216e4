"""How reduce states travel as OpenTelemetry metric points, both ways.

``encode`` turns one process's per-step states into OTel SDK metric data (exported by the
SDK's own OTLP exporters); ``decode`` turns a received OTLP request back into states that
``Reduce.get(name).accumulator_class.get_reduced_value_from_states`` merges exactly.

Every point carries ``rankscope.reduce`` and, when the process has flushed a step,
``rankscope.step``. Each reduce type uses the OTel point type that holds its state:

=============  =========================================================================
reduce         OTel point (delta temporality)
=============  =========================================================================
sum            Sum (non-monotonic), value = sum
count          Sum (monotonic), value = count
mean           Histogram without buckets: count, sum
std            Histogram without buckets: count, sum; sum of squares in ``rankscope.sum_sq``
max, min       Gauge, value
last           Gauge, value, time = when it was recorded
distribution   ExponentialHistogram at scale 6: buckets, zero count, count, sum, min, max
custom         Gauge per numeric state field, field name in ``rankscope.state``
=============  =========================================================================
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Buckets,
    ExponentialHistogram,
    ExponentialHistogramDataPoint,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    NumberDataPoint,
    Sum,
)

from . import attributes as attr
from .reduce import MetricAccumulator

SUM_SQ = "rankscope.sum_sq"
_DELTA = AggregationTemporality.DELTA


def encode(
    key: str,
    acc: MetricAccumulator,
    step: int | None,
    start_time_unix_nano: int,
    time_unix_nano: int,
) -> Metric | None:
    """One metric for one key's state in one step, or None when a custom state has no numbers."""
    state = acc.get_state()
    name = acc.reduction_type.value
    point_attrs: dict[str, Any] = {attr.REDUCE: name}
    if step is not None:
        point_attrs[attr.STEP] = step
    t0, t1 = start_time_unix_nano, time_unix_nano
    data: Any
    if name in ("sum", "count"):
        value = state[name]
        data = Sum([NumberDataPoint(point_attrs, t0, t1, value)], _DELTA, is_monotonic=name == "count")
    elif name in ("max", "min"):
        data = Gauge([NumberDataPoint(point_attrs, t0, t1, state[name])])
    elif name == "last":
        data = Gauge([NumberDataPoint(point_attrs, t0, state["time_unix_nano"] or t1, state["value"])])
    elif name in ("mean", "std"):
        if name == "std":
            point_attrs[SUM_SQ] = float(state["sum_sq"])
        count = state["count"]
        point = HistogramDataPoint(point_attrs, t0, t1, count, state["sum"], [count], [], None, None)  # type: ignore[arg-type]
        data = Histogram([point], _DELTA)
    elif name == "distribution":
        point_e = ExponentialHistogramDataPoint(
            point_attrs, t0, t1,
            count=state["count"], sum=state["sum"], scale=state["scale"], zero_count=state["zero_count"],
            positive=_dense(state["positive"]), negative=_dense(state["negative"]), flags=0,
            min=state["min"], max=state["max"],
        )
        data = ExponentialHistogram([point_e], _DELTA)
    else:
        points = [
            NumberDataPoint({**point_attrs, attr.STATE_FIELD: field}, t0, t1, value)
            for field, value in state.items()
            if field != "reduction_type" and isinstance(value, (int, float)) and not isinstance(value, bool)
        ]
        if not points:
            return None
        data = Gauge(points)
    return Metric(name=key, description=None, unit=None, data=data)


def _dense(buckets: Mapping[int, int]) -> Buckets:
    if not buckets:
        return Buckets(0, [])
    lo, hi = min(buckets), max(buckets)
    counts = [0] * (hi - lo + 1)
    for index, n in buckets.items():
        counts[index - lo] = n
    return Buckets(lo, counts)


@dataclass(frozen=True, slots=True)
class DecodedPoint:
    """One key's state from one process, as it came off the wire."""

    resource: Mapping[str, Any]
    key: str
    reduce: str
    step: int | None
    state: dict[str, Any]
    time_unix_nano: int


def _any_value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind in ("string_value", "bool_value", "int_value", "double_value") else None


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _any_value(kv.value) for kv in kvs}


def decode(request: Any) -> Iterator[DecodedPoint]:
    """Yield rankscope states from an ``ExportMetricsServiceRequest``; other metrics are skipped."""
    for rm in request.resource_metrics:
        resource = _attrs(rm.resource.attributes)
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                yield from _decode_metric(resource, metric)


def _decode_metric(resource: Mapping[str, Any], metric: Any) -> Iterator[DecodedPoint]:
    kind = metric.WhichOneof("data")
    if kind is None:
        return
    custom: dict[tuple[str, int | None, int], dict[str, Any]] = {}
    for point in getattr(metric, kind).data_points:
        a = _attrs(point.attributes)
        reduce = a.get(attr.REDUCE)
        if not isinstance(reduce, str):
            continue
        step = a.get(attr.STEP)
        t = point.time_unix_nano
        state: dict[str, Any] = {"reduction_type": reduce}
        if kind == "sum" or (kind == "gauge" and reduce in ("max", "min", "last")):
            value = _number(point)
            if reduce == "last":
                state.update(value=value, time_unix_nano=t)
            else:
                state[reduce] = value
        elif kind == "histogram":
            state.update(sum=point.sum, count=point.count)
            if reduce == "std":
                state["sum_sq"] = float(a.get(SUM_SQ, 0.0))
        elif kind == "exponential_histogram":
            state.update(
                scale=point.scale, count=point.count, sum=point.sum, min=point.min, max=point.max,
                zero_count=point.zero_count,
                positive={point.positive.offset + i: n for i, n in enumerate(point.positive.bucket_counts) if n},
                negative={point.negative.offset + i: n for i, n in enumerate(point.negative.bucket_counts) if n},
            )
        elif kind == "gauge":
            field = a.get(attr.STATE_FIELD)
            if isinstance(field, str):
                custom.setdefault((reduce, step, t), {"reduction_type": reduce})[field] = _number(point)
            continue
        else:
            continue
        yield DecodedPoint(resource, metric.name, reduce, step, state, t)
    for (reduce, step, t), state in custom.items():
        yield DecodedPoint(resource, metric.name, reduce, step, state, t)


def _number(point: Any) -> float | int:
    return point.as_double if point.WhichOneof("value") == "as_double" else point.as_int
