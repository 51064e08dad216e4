"""How reduce states travel as OpenTelemetry metric points, both ways.

``encode`` turns one process's per-step states into OTLP metric protobufs (sent by the
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

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from ..core import names as attr
from ..metrics.reduce import MetricAccumulator

SUM_SQ = "rankscope.sum_sq"
_DELTA = pb.AGGREGATION_TEMPORALITY_DELTA


def key_value(key: str, value: str | int | float) -> KeyValue:
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, str):
        return KeyValue(key=key, value=AnyValue(string_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(double_value=value))


def encode_resource(attributes: Mapping[str, Any]) -> Resource:
    return Resource(attributes=[key_value(k, v) for k, v in attributes.items() if isinstance(v, (str, int, float))])


class PointAttributes:
    """Encoded ``{rankscope.reduce, rankscope.step}`` lists, built once per (reduce, step)."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, int | None], list[KeyValue]] = {}

    def get(self, reduce: str, step: int | None) -> list[KeyValue]:
        found = self._cache.get((reduce, step))
        if found is None:
            found = [key_value(attr.REDUCE, reduce)]
            if step is not None:
                found.append(key_value(attr.STEP, step))
            if len(self._cache) > 4096:
                self._cache.clear()
            self._cache[(reduce, step)] = found
        return found


_units: dict[str, str] = {}


def _unit(key: str) -> str:
    """The catalog's UCUM unit of a standard metric, "" for the user's own keys (cached)."""
    unit = _units.get(key)
    if unit is None:
        from ..catalog import unit_of

        unit = _units[key] = unit_of(key)
        if len(_units) > 100_000:
            _units.clear()
    return unit


def encode(
    key: str,
    acc: MetricAccumulator,
    step: int | None,
    start_time_unix_nano: int,
    time_unix_nano: int,
    point_attributes: PointAttributes,
) -> pb.Metric | None:
    """One OTLP metric for one key's state in one step, or None when a custom state has no numbers."""
    state = acc.get_state()
    name = acc.reduction_type.value
    kvs = point_attributes.get(name, step)
    metric = pb.Metric(name=key, unit=_unit(key))
    t0, t1 = start_time_unix_nano, time_unix_nano
    if name in ("sum", "count"):
        metric.sum.aggregation_temporality = _DELTA
        metric.sum.is_monotonic = name == "count"
        _number(metric.sum.data_points.add(start_time_unix_nano=t0, time_unix_nano=t1), state[name], kvs)
    elif name in ("max", "min"):
        _number(metric.gauge.data_points.add(start_time_unix_nano=t0, time_unix_nano=t1), state[name], kvs)
    elif name == "last":
        point = metric.gauge.data_points.add(start_time_unix_nano=t0, time_unix_nano=state["time_unix_nano"] or t1)
        _number(point, state["value"], kvs)
    elif name in ("mean", "std"):
        metric.histogram.aggregation_temporality = _DELTA
        count = state["count"]
        h = metric.histogram.data_points.add(
            start_time_unix_nano=t0, time_unix_nano=t1, count=count, sum=state["sum"], bucket_counts=[count]
        )
        h.attributes.extend(kvs)
        if name == "std":
            h.attributes.append(key_value(SUM_SQ, float(state["sum_sq"])))
    elif name == "distribution":
        metric.exponential_histogram.aggregation_temporality = _DELTA
        e = metric.exponential_histogram.data_points.add(
            start_time_unix_nano=t0,
            time_unix_nano=t1,
            count=state["count"],
            sum=state["sum"],
            scale=state["scale"],
            zero_count=state["zero_count"],
            min=state["min"],
            max=state["max"],
        )
        e.attributes.extend(kvs)
        _dense(e.positive, state["positive"])
        _dense(e.negative, state["negative"])
    else:
        for field, value in state.items():
            if field != "reduction_type" and isinstance(value, (int, float)) and not isinstance(value, bool):
                point = metric.gauge.data_points.add(start_time_unix_nano=t0, time_unix_nano=t1)
                _number(point, value, kvs)
                point.attributes.append(key_value(attr.STATE_FIELD, field))
        if not metric.gauge.data_points:
            return None
    return metric


def _number(point: Any, value: float | int, kvs: list[KeyValue]) -> None:
    if isinstance(value, int):
        point.as_int = value
    else:
        point.as_double = value
    point.attributes.extend(kvs)


def _dense(target: Any, buckets: Mapping[int, int]) -> None:
    if buckets:
        lo, hi = min(buckets), max(buckets)
        counts = [0] * (hi - lo + 1)
        for index, n in buckets.items():
            counts[index - lo] = n
        target.offset = lo
        target.bucket_counts.extend(counts)


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


def attributes_dict(kvs: Any) -> dict[str, Any]:
    return {kv.key: _any_value(kv.value) for kv in kvs}


def decode(request: Any) -> Iterator[DecodedPoint]:
    """Yield rankscope states from an ``ExportMetricsServiceRequest``; other metrics are skipped."""
    for rm in request.resource_metrics:
        resource = attributes_dict(rm.resource.attributes)
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                yield from decode_metric(resource, metric)


def decode_metric(resource: Mapping[str, Any], metric: Any) -> Iterator[DecodedPoint]:
    kind = metric.WhichOneof("data")
    if kind is None:
        return
    custom: dict[tuple[str, int | None, int], dict[str, Any]] = {}
    for point in getattr(metric, kind).data_points:
        a = attributes_dict(point.attributes)
        reduce = a.get(attr.REDUCE)
        if not isinstance(reduce, str):
            continue
        step = a.get(attr.STEP)
        t = point.time_unix_nano
        state: dict[str, Any] = {"reduction_type": reduce}
        if kind == "sum" or (kind == "gauge" and reduce in ("max", "min", "last")):
            value = _point_value(point)
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
                scale=point.scale,
                count=point.count,
                sum=point.sum,
                min=point.min,
                max=point.max,
                zero_count=point.zero_count,
                positive={point.positive.offset + i: n for i, n in enumerate(point.positive.bucket_counts) if n},
                negative={point.negative.offset + i: n for i, n in enumerate(point.negative.bucket_counts) if n},
            )
        elif kind == "gauge":
            field = a.get(attr.STATE_FIELD)
            if isinstance(field, str):
                custom.setdefault((reduce, step, t), {"reduction_type": reduce})[field] = _point_value(point)
            continue
        else:
            continue
        yield DecodedPoint(resource, metric.name, reduce, step, state, t)
    for (reduce, step, t), state in custom.items():
        yield DecodedPoint(resource, metric.name, reduce, step, state, t)


def _point_value(point: Any) -> float | int:
    return point.as_double if point.WhichOneof("value") == "as_double" else point.as_int
