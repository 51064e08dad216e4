"""How reduce states travel as OpenTelemetry metric points, both ways.

``encode`` turns one process's per-step states into OTLP metric protobufs (sent by the
SDK's own OTLP exporters); ``read_row`` turns a received point back into its state as a row of
numbers (``FIELDS``; ``state_of`` gives the dict that
``Reduce.get(name).accumulator_class.get_reduced_value_from_states`` merges exactly), or into
the reason the point does not hold one (a sink's edge refuses it: ``sink.edge.validate``).

Every point carries ``rankscope.reduce`` and, when the process has flushed a step,
``rankscope.step``. Each reduce type uses the OTel point type that holds its state:

=============  =========================================================================
reduce         OTel point (delta temporality)
=============  =========================================================================
sum            Sum (non-monotonic), value = sum
count          Sum (monotonic), value = count
mean           Histogram without buckets: count, sum
std            Histogram without buckets: count, sum; sum of squares in ``rankscope.sum_sq``
max, min       Gauge, value; merged by the Collector: ``rankscope.extreme.rank``/``label``
last           Gauge, value, time = when it was recorded
distribution   ExponentialHistogram at scale 6: buckets, zero count, count, sum, min, max
custom         Gauge per numeric state field, field name in ``rankscope.state``
=============  =========================================================================
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb

from ..core import names as attr
from ..metrics.catalog import unit_of
from ..metrics.reduce import BUILTIN_REDUCES, DISTRIBUTION_SCALE, MetricAccumulator, Reduce
from .common import attributes, decode_step, key_value, number
from .raw import decode_attributes, resource_metrics

SUM_SQ = attr.SUM_SQ
_DELTA = pb.AGGREGATION_TEMPORALITY_DELTA


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


# -- decoding (checked) -----------------------------------------------------------------

MAX_SCALE = 20
MAX_BUCKETS = 16_384

FIELDS: dict[str, tuple[str, ...]] = {
    "sum": ("sum",),
    "count": ("count",),
    "mean": ("count", "sum"),
    "std": ("count", "sum", "sum_sq"),
    "max": ("max", "holder_rank", "holder_label"),
    "min": ("min", "holder_rank", "holder_label"),
    "last": ("value", "time_unix_nano"),
    "distribution": ("state",),
}
"""A built-in reduce type's state as a row (a tuple), field by field: what a sink keeps of a
point. MAX/MIN carry the holder of the extreme when a Collector merged them (else None); a
distribution's row is its whole state."""

Row = tuple[Any, ...]
Reader = Callable[[str, Any, Mapping[str, Any], int], "Row | str"]
"""(point kind, point, its other attributes, max buckets) -> row, or why it holds none."""


def state_of(reduce: str, row: Row) -> dict[str, Any]:
    """The accumulator state of a built-in reduce type's row (``get_reduced_value_from_states`` takes it)."""
    if reduce == "distribution":
        return dict(row[0])
    state: dict[str, Any] = {"reduction_type": reduce}
    state.update((name, value) for name, value in zip(FIELDS[reduce], row, strict=True) if value is not None)
    return state


def row_of(reduce: str, state: Mapping[str, Any]) -> Row:
    """The row of a built-in reduce type's state (the inverse of ``state_of``)."""
    if reduce == "distribution":
        return (dict(state),)
    return tuple(state.get(name) for name in FIELDS[reduce])


def read_row(reduce: str, kind: str, point: Any, extra: Mapping[str, Any], max_buckets: int = MAX_BUCKETS) -> Row | str:
    """The row a built-in reduce type's point holds, or why the point does not hold one.

    ``kind`` is the metric's data field (``sum``, ``gauge``, ``histogram``,
    ``exponential_histogram``), ``extra`` the point's attributes other than reduce and step;
    the table in the module docstring says which kind each reduce type travels as. Never
    raises on what a client sent."""
    reader = READERS.get(reduce)
    if reader is None:
        return f"{reduce!r} is not a built-in reduce type"
    return reader(kind, point, extra, max_buckets)


def _value(p: pb.NumberDataPoint) -> float | int:
    """A NumberDataPoint's value (``common.number``, faster: a non-zero double needs no oneof test)."""
    value = p.as_double
    return value if value or p.WhichOneof("value") != "as_int" else p.as_int


def _sum(kind: str, p: Any, extra: Mapping[str, Any], max_buckets: int) -> Row | str:
    if kind != "sum":
        return f"sum travels as a Sum point, not {kind}"
    return (_value(p),)


def _count(kind: str, p: Any, extra: Mapping[str, Any], max_buckets: int) -> Row | str:
    if kind != "sum":
        return f"count travels as a Sum point, not {kind}"
    value = p.as_int
    if (not value and p.WhichOneof("value") == "as_double") or value < 0:
        return "count must be a non-negative integer"
    return (value,)


def _mean(kind: str, p: Any, extra: Mapping[str, Any], max_buckets: int) -> Row | str:
    if kind != "histogram":
        return f"mean travels as a Histogram point, not {kind}"
    return (p.count, p.sum)


def _std(kind: str, p: Any, extra: Mapping[str, Any], max_buckets: int) -> Row | str:
    if kind != "histogram":
        return f"std travels as a Histogram point, not {kind}"
    sum_sq = extra.get(SUM_SQ)
    if isinstance(sum_sq, bool) or not isinstance(sum_sq, (int, float)):
        return f"std needs a numeric {SUM_SQ} attribute"
    return (p.count, p.sum, float(sum_sq))


_MAX_LABEL = 512


def _extreme(reduce: str) -> Reader:
    def read(kind: str, p: Any, extra: Mapping[str, Any], max_buckets: int) -> Row | str:
        if kind != "gauge":
            return f"{reduce} travels as a Gauge point, not {kind}"
        value = _value(p)
        if not extra:
            return (value, None, None)
        if attr.STATE_FIELD in extra:
            return f"{reduce} is built in: no {attr.STATE_FIELD} attribute"
        rank, label = extra.get(attr.EXTREME_RANK), extra.get(attr.EXTREME_LABEL)
        if rank is None:
            return (value, None, None)
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < 2**31:
            return f"{attr.EXTREME_RANK} must be a non-negative integer"
        if label is not None and (not isinstance(label, str) or not label.isprintable() or len(label) > _MAX_LABEL):
            return f"{attr.EXTREME_LABEL} must be printable text of at most {_MAX_LABEL} characters"
        return (value, rank, label)

    return read


def _last(kind: str, p: Any, extra: Mapping[str, Any], max_buckets: int) -> Row | str:
    if kind != "gauge":
        return f"last travels as a Gauge point, not {kind}"
    if attr.STATE_FIELD in extra:
        return f"last is built in: no {attr.STATE_FIELD} attribute"
    return (_value(p), p.time_unix_nano)


def _distribution(kind: str, p: Any, extra: Mapping[str, Any], max_buckets: int) -> Row | str:
    if kind != "exponential_histogram":
        return f"distribution travels as an ExponentialHistogram point, not {kind}"
    state = exponential_state(p, DISTRIBUTION_SCALE, max_buckets, absent=0.0)
    return state if isinstance(state, str) else ({"reduction_type": "distribution", **state},)


def exponential_state(point: Any, min_scale: int, max_buckets: int, absent: float) -> dict[str, Any] | str:
    """An ExponentialHistogram point's state (scale, count, sum, min, max, zero_count, positive and
    negative buckets by index), or why it holds none: its scale in [``min_scale``, 20], bucket
    indexes within the finite doubles, at most ``max_buckets`` a side, buckets adding up to no more
    than its count. A missing min or max reads as ``absent``."""
    scale = point.scale
    if not min_scale <= scale <= MAX_SCALE:
        return f"scale {scale} outside [{min_scale}, {MAX_SCALE}]"
    # Bucket i holds (2**(i / 2**scale), 2**((i + 1) / 2**scale)]: finite doubles keep i in [low, high)
    # (2**-1074 is the smallest double: its index is the lowest).
    low, high = math.ceil(-1074 * 2.0**scale) - 1, math.ceil(1024 * 2.0**scale)
    buckets = []
    for side in (point.positive, point.negative):
        counts = side.bucket_counts
        if len(counts) > max_buckets:
            return f"{len(counts)} buckets (limit {max_buckets})"
        if counts and not (low <= side.offset and side.offset + len(counts) <= high):
            return f"bucket offset {side.offset} out of range at scale {scale}"
        buckets.append({side.offset + i: n for i, n in enumerate(counts) if n})
    total = point.zero_count + sum(buckets[0].values()) + sum(buckets[1].values())
    if total > point.count:
        return f"buckets hold {total} values but count is {point.count}"
    return {
        "scale": scale,
        "count": point.count,
        "sum": point.sum,
        "min": point.min if point.HasField("min") else absent,
        "max": point.max if point.HasField("max") else absent,
        "zero_count": point.zero_count,
        "positive": buckets[0],
        "negative": buckets[1],
    }


def read_spread(extra: Mapping[str, Any]) -> Row | None:
    """A merged MEAN/SUM/STD point's spread of the processes' own values (``rankscope.spread.*``,
    the Go merge processor's): ``(n, mean, m2, low, low_rank, low_label, high, high_rank,
    high_label)``; ``(0,)`` for no process; None when it carries none or a malformed one (the
    point itself is taken: only the key's spread is not known)."""
    n = extra.get(attr.SPREAD_N)
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n < 2**31:
        return None
    if n == 0:
        return (0,)
    numbers: list[float] = []
    for key in (attr.SPREAD_MEAN, attr.SPREAD_M2, attr.SPREAD_LOW, attr.SPREAD_HIGH):
        value = extra.get(key)
        if not isinstance(value, float) or not math.isfinite(value):
            return None
        numbers.append(value)
    mean, m2, low, high = numbers
    if m2 < 0 or low > high:
        return None
    ranks = [extra.get(attr.SPREAD_LOW_RANK), extra.get(attr.SPREAD_HIGH_RANK)]
    labels = [extra.get(attr.SPREAD_LOW_LABEL, ""), extra.get(attr.SPREAD_HIGH_LABEL, "")]
    for rank, label in zip(ranks, labels, strict=True):
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < 2**31:
            return None
        if not isinstance(label, str) or not label.isprintable() or len(label) > _MAX_LABEL:
            return None
    return (n, mean, m2, low, ranks[0], labels[0], high, ranks[1], labels[1])


READERS: dict[str, Reader] = {
    "sum": _sum,
    "count": _count,
    "mean": _mean,
    "std": _std,
    "max": _extreme("max"),
    "min": _extreme("min"),
    "last": _last,
    "distribution": _distribution,
}


def decode_custom_field(
    reduce: str, kind: str, point: Any, point_attributes: Mapping[str, Any]
) -> tuple[str, float | int] | str:
    """(state field, value) of one point of a custom reduce type's state, or why it is refused."""
    field_name = point_attributes.get(attr.STATE_FIELD)
    if kind != "gauge" or not isinstance(field_name, str) or not field_name or len(field_name) > 64:
        return f"custom reduce {reduce!r} travels as Gauge points with a string {attr.STATE_FIELD}"
    if field_name == "reduction_type":
        return f"custom reduce {reduce!r}: {attr.STATE_FIELD} may not be 'reduction_type'"
    if not field_name.isprintable():
        return f"custom reduce {reduce!r}: {attr.STATE_FIELD} has control characters"
    return field_name, number(point)


def check_custom_state(reduce: str, state: dict[str, Any]) -> str | None:
    """Why a custom state cannot be merged, or None (the reducer is third-party code: try it once)."""
    try:
        value = Reduce.get(reduce).accumulator_class.get_reduced_value_from_states([state])
        if isinstance(value, dict):
            ok = all(isinstance(k, str) and isinstance(v, (int, float)) for k, v in value.items())
        else:
            ok = isinstance(value, (int, float))
    except Exception as exc:
        return f"custom reduce {reduce!r} cannot merge this state ({type(exc).__name__})"
    return None if ok else f"custom reduce {reduce!r} gave a non-numeric value"


@dataclass(frozen=True, slots=True)
class DecodedPoint:
    """One key's state from one process, as it came off the wire."""

    resource: Mapping[str, Any]
    key: str
    reduce: str
    step: int | None
    state: dict[str, Any]
    time_unix_nano: int


def decode(request: Any) -> Iterator[DecodedPoint]:
    """Every rankscope state in an ``ExportMetricsServiceRequest`` that decodes; others are
    skipped. For tests and tools: a sink's edge (``sink.edge.validate``) reads the same rows, counts
    and answers what it refuses, and is built for speed."""
    for _, rm in resource_metrics(request):
        resource = attributes(rm.resource.attributes)
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                if kind is None:
                    continue
                custom: dict[tuple[str, int | None, int], dict[str, Any]] = {}
                for point in getattr(metric, kind).data_points:
                    a = decode_attributes(point.attributes)
                    if isinstance(a, str):
                        continue
                    reduce, step = a.get(attr.REDUCE), decode_step(a.get(attr.STEP))
                    if not isinstance(reduce, str) or isinstance(step, str):
                        continue
                    reduce = reduce.lower()
                    if reduce in BUILTIN_REDUCES:
                        row = read_row(reduce, kind, point, a)
                        if not isinstance(row, str):
                            state = state_of(reduce, row)
                            yield DecodedPoint(resource, metric.name, reduce, step, state, point.time_unix_nano)
                    else:
                        found = decode_custom_field(reduce, kind, point, a)
                        if not isinstance(found, str):
                            key = (reduce, step, point.time_unix_nano)
                            custom.setdefault(key, {"reduction_type": reduce})[found[0]] = found[1]
                for (reduce, step, t), state in custom.items():
                    yield DecodedPoint(resource, metric.name, reduce, step, state, t)
