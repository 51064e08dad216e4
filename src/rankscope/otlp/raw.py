"""OTLP metric requests whose points keep their attributes as raw bytes.

One process's request repeats a handful of attribute lists (``{rankscope.reduce,
rankscope.step}``) over hundreds of points, and a sink takes a thousand such requests per
step. Turning every ``KeyValue`` into a message and a dict costs more than the rest of the
ingest path together, so the sink parses requests with ``RawExportMetricsServiceRequest``: the
OTLP message with the same field numbers (wire-identical), except that every data point's
``attributes`` is declared ``repeated bytes``. Each point then yields its encoded KeyValues as
bytes, and an identical list is decoded once (the sink's edge caches what it means).

A request is decoded one level further up too: each ResourceMetrics' bytes are kept as they
arrived next to its parsed message, so a sink can fingerprint what a process sent (to know a
retry) without encoding it again.

What a request costs is counted before it is decoded (``walk_metrics``). Decoding allocates per
message, and the sink's checks cost per point, so a 4 MB body of two-byte empty points is two
million of each: 150 MB of parsed messages and seconds of checks for one request. The walk reads
the wire format down to the points (never into one) and stops at the first bound it passes;
``bounded_metrics`` decodes only a request within them. The transports hand the body on as it
came (``parse_metrics``: an ``EncodedMetrics``), so the sink's edge decodes it under its own bounds.
Traces and logs requests are one shape (a request of resources, of scopes, of spans or log records:
the sink checks and stores each record whole), walked alike down to each record's length
(``walk_records``) and handed on encoded as well (``parse_traces``, ``parse_logs``).

Built at import from the OTLP package's own descriptors, in private descriptor pools.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.resource.v1 import resource_pb2

from .common import any_value

_POINTS = ("NumberDataPoint", "HistogramDataPoint", "ExponentialHistogramDataPoint", "SummaryDataPoint")


def _file(module: Any) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(proto)
    return proto


def _raw_classes() -> tuple[Any, Any]:
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_file(common_pb2))
    pool.Add(_file(resource_pb2))
    metrics = _file(metrics_pb2)
    for message in metrics.message_type:
        if message.name in _POINTS:
            for field in message.field:
                if field.name == "attributes":
                    field.type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
                    field.ClearField("type_name")
    pool.Add(metrics)
    pool.Add(_file(metrics_service_pb2))
    request = metrics_service_pb2.ExportMetricsServiceRequest.DESCRIPTOR
    resource_metrics = metrics_pb2.ResourceMetrics.DESCRIPTOR
    return (
        message_factory.GetMessageClass(pool.FindMessageTypeByName(request.full_name)),
        message_factory.GetMessageClass(pool.FindMessageTypeByName(resource_metrics.full_name)),
    )


def _split_class() -> Any:
    """``ExportMetricsServiceRequest`` with ``resource_metrics`` declared ``repeated bytes``."""
    proto = descriptor_pb2.FileDescriptorProto(name="rankscope/split_metrics.proto", package="rankscope.split")
    message = proto.message_type.add(name="ExportMetricsServiceRequest")
    message.field.add(
        name="resource_metrics",
        number=metrics_service_pb2.ExportMetricsServiceRequest.RESOURCE_METRICS_FIELD_NUMBER,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_BYTES,
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("rankscope.split.ExportMetricsServiceRequest"))


RawExportMetricsServiceRequest, RawResourceMetrics = _raw_classes()
"""``ExportMetricsServiceRequest`` and ``ResourceMetrics`` with raw point attributes."""
_SplitRequest = _split_class()

ParsedMetrics = list[tuple[bytes, Any]]
"""A request's ResourceMetrics: (the bytes it arrived as, its ``RawResourceMetrics``)."""


@dataclass(frozen=True, slots=True)
class EncodedMetrics:
    """An ``ExportMetricsServiceRequest`` as it arrived: what the transports hand the sink, which
    decodes it under its bounds (``bounded_metrics``) or refuses it whole before decoding it."""

    body: bytes


def parse_metrics(body: bytes) -> EncodedMetrics:
    """An encoded ``ExportMetricsServiceRequest`` as the transports take it: kept encoded, so the
    sink's edge counts what it costs before decoding it (``bounded_metrics``)."""
    return EncodedMetrics(bytes(body))


def resource_metrics(request: Any) -> ParsedMetrics:
    """A request in any form (decoded already, ``EncodedMetrics``, bytes, or any message of it),
    decoded without bounds (for tools and tests; the sink decodes under its own: ``bounded_metrics``).
    Raises ``DecodeError`` if it is not one."""
    if isinstance(request, list):
        return request
    if isinstance(request, EncodedMetrics):
        request = request.body
    split = _SplitRequest.FromString(request if isinstance(request, bytes) else request.SerializeToString())
    return [(encoded, RawResourceMetrics.FromString(encoded)) for encoded in split.resource_metrics]


class Walked(NamedTuple):
    """What ``walk_metrics`` counted of a request, up to where it stopped."""

    spans: list[tuple[int, int]]
    """Where each ResourceMetrics lies in the body (start, end), the first ``max_resources`` at most."""
    points: int
    """Points counted (a metric without points and a scope without metrics count one each: each
    is a message to decode and a loop to run; so does each field past the first four of a message
    the walk reads: ``_FREE``); -1 when not counted: the body is too short to hold more than
    ``max_points`` (every one of them costs two bytes at least)."""
    over: str
    """``""``: within the bounds; ``"resources"`` or ``"points"``: the walk stopped past that bound
    (``spans`` or ``points`` is then one over it)."""


def walk_metrics(body: bytes, max_resources: int, max_points: int, *, count: bool = False) -> Walked:
    """Count the ResourceMetrics and points of an encoded ``ExportMetricsServiceRequest`` without
    decoding it, stopping at the first bound passed. Reads the wire format down to each point's
    length (never into a point), so it costs a few operations per point, and nothing per point
    when the body is too short to pass ``max_points`` (unless ``count``). Raises ``DecodeError``
    when the framing of a level it reads is broken (the parser would refuse it too) or holds a
    group (which the parser would skip field by field, and no OTLP message has)."""
    try:
        return _walk(body, max_resources, max_points, count, _scope_points)
    except IndexError:  # a point's key at the very end of the body
        raise DecodeError("a field runs past the end of the request") from None


@dataclass(frozen=True, slots=True)
class EncodedTraces:
    """An ``ExportTraceServiceRequest`` as it arrived (``EncodedMetrics``' counterpart)."""

    body: bytes


@dataclass(frozen=True, slots=True)
class EncodedLogs:
    """An ``ExportLogsServiceRequest`` as it arrived (``EncodedMetrics``' counterpart)."""

    body: bytes


def parse_traces(body: bytes) -> EncodedTraces:
    """An encoded ``ExportTraceServiceRequest`` as the transports take it: kept encoded (``parse_metrics``)."""
    return EncodedTraces(bytes(body))


def parse_logs(body: bytes) -> EncodedLogs:
    """An encoded ``ExportLogsServiceRequest`` as the transports take it: kept encoded (``parse_metrics``)."""
    return EncodedLogs(bytes(body))


def walk_records(body: bytes, max_resources: int, max_records: int, *, count: bool = False) -> Walked:
    """``walk_metrics`` for an encoded ``ExportTraceServiceRequest`` or ``ExportLogsServiceRequest``
    (the same shape: resources of scopes of records, each at field 2 of its parent): its spans or
    log records are counted as ``points``, a scope without any as one. Reads each record's key and
    length only (never into one)."""
    try:
        return _walk(body, max_resources, max_records, count, _scope_records)
    except IndexError:  # a record's key at the very end of the body
        raise DecodeError("a field runs past the end of the request") from None


_Scope = Callable[[bytes, int, int, int], int]
"""Counts the units of one scope in ``buf[i:end]``, stopped once past a budget (``_scope_points``)."""


def _walk(body: bytes, max_resources: int, max_points: int, count: bool, scope: _Scope) -> Walked:
    end = len(body)
    count = count or end > 2 * max_points  # a point (or an empty metric or scope) is two bytes at least
    spans: list[tuple[int, int]] = []
    points = other = 0
    i = 0
    while i < end:
        key, i = _varint(body, i)
        if key != _RESOURCE_METRICS:
            i = _skip(body, i, end, key)
            other += 1
            if count and other > _FREE:
                points += 1
                if points > max_points:
                    return Walked(spans, points, "points")
            continue
        size, i = _varint(body, i)
        stop = i + size
        if stop > end:
            raise DecodeError("a ResourceMetrics runs past the end of the request")
        spans.append((i, stop))
        if len(spans) > max_resources:
            return Walked(spans, points if count else -1, "resources")
        if count:
            points += _resource_points(body, i, stop, max_points - points, scope)
            if points > max_points:
                return Walked(spans, points, "points")
        i = stop
    return Walked(spans, points if count else -1, "")


def bounded_metrics(body: bytes, max_resources: int, max_points: int) -> ParsedMetrics | Walked:
    """The request decoded (``ParsedMetrics``) when it is within the bounds, else what the walk
    counted before it stopped (``Walked``, nothing decoded). Raises ``DecodeError``."""
    walked = walk_metrics(body, max_resources, max_points)
    if walked.over:
        return walked
    return metrics_at(body, walked.spans)


def metrics_at(body: bytes, spans: list[tuple[int, int]]) -> ParsedMetrics:
    """The ResourceMetrics that lie at ``spans`` in ``body`` (a walk found them), each decoded."""
    parsed: ParsedMetrics = []
    for start, end in spans:
        encoded = body[start:end]
        parsed.append((encoded, RawResourceMetrics.FromString(encoded)))
    return parsed


_RESOURCE_METRICS = 1 << 3 | 2
"""The key of ``ExportMetricsServiceRequest.resource_metrics`` (field 1, length-delimited), and of
``resource_spans`` and ``resource_logs`` in their requests."""
_SCOPE_METRICS = _METRICS = _RECORDS = 2 << 3 | 2
"""``ResourceMetrics.scope_metrics`` and ``ScopeMetrics.metrics`` (field 2 each); so are
``ResourceSpans.scope_spans``, ``ScopeSpans.spans``, ``ResourceLogs.scope_logs`` and ``ScopeLogs.log_records``."""
_POINTS_TAG = 1 << 3 | 2
"""``data_points`` of a Gauge, Sum, Histogram, ExponentialHistogram or Summary (field 1)."""
_DATA = frozenset(n << 3 | 2 for n in (5, 7, 9, 10, 11))
"""``Metric``'s gauge, sum, histogram, exponential_histogram and summary: each holds ``data_points`` (field 1)."""
_FREE = 4
"""Fields of one message the walk steps over without counting them (a Metric's name, description,
unit and data; a Sum's temporality and monotonicity; a Resource, a scope, a schema URL): each
further one counts as a point, as stepping over it costs the walk what a point costs. A body of
two-byte unknown fields is refused as fast as one of empty points."""


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    """The varint at ``i`` and the index after it."""
    try:
        byte = buf[i]
        if byte < 0x80:
            return byte, i + 1
        value, shift = byte & 0x7F, 7
        while True:
            i += 1
            byte = buf[i]
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value, i + 1
            shift += 7
            if shift > 63:
                raise DecodeError("a varint longer than ten bytes")
    except IndexError:
        raise DecodeError("a varint runs past the end of the request") from None


def _skip(buf: bytes, i: int, end: int, key: int) -> int:
    """The index after the value of the field whose key was just read, checked against ``end``.
    A group (wire types 3 and 4: no OTLP message has one) is refused as undecodable, not walked."""
    wire = key & 7
    if wire == 0:
        _, i = _varint(buf, i)
    elif wire == 2:
        size, i = _varint(buf, i)
        i += size
    elif wire == 1:
        i += 8
    elif wire == 5:
        i += 4
    else:
        raise DecodeError(f"wire type {wire} (a group, or none) where an OTLP field was expected")
    if i > end:
        raise DecodeError("a field runs past the end of its message")
    return i


def _resource_points(buf: bytes, i: int, end: int, budget: int, scope: _Scope) -> int:
    """Points of one ResourceMetrics (records of one ResourceSpans or ResourceLogs: ``scope`` counts
    one of its scopes) in ``buf[i:end]``, counting stopped once past ``budget``."""
    points = other = 0
    while i < end:
        key, i = _varint(buf, i)
        if key != _SCOPE_METRICS:
            i = _skip(buf, i, end, key)
            other += 1
            points += other > _FREE
        else:
            size, i = _varint(buf, i)
            stop = i + size
            if stop > end:
                raise DecodeError("a ScopeMetrics runs past the end of its ResourceMetrics")
            points += scope(buf, i, stop, budget - points) or 1
            i = stop
        if points > budget:
            return points
    return points


def _scope_points(buf: bytes, i: int, end: int, budget: int) -> int:
    """Points of one ScopeMetrics in ``buf[i:end]``, a Metric without any counting one; stopped
    once past ``budget``. The hot loop of a large request, so keys and lengths of one byte are
    read inline."""
    points = other = 0
    while i < end:
        key = buf[i]
        i += 1
        if key > 0x7F:
            key, i = _varint(buf, i - 1)
        if key != _METRICS:
            i = _skip(buf, i, end, key)
            other += 1
            points += other > _FREE
        else:
            size = buf[i]
            i += 1
            if size > 0x7F:
                size, i = _varint(buf, i - 1)
            stop = i + size
            if stop > end:
                raise DecodeError("a Metric runs past the end of its ScopeMetrics")
            points += _metric_points(buf, i, stop, budget - points) or 1
            i = stop
        if points > budget:
            return points
    return points


def _scope_records(buf: bytes, i: int, end: int, budget: int) -> int:
    """Spans of one ScopeSpans (log records of one ScopeLogs) in ``buf[i:end]``, stopped once past
    ``budget``: of each record only its key and length are read (keys and lengths of one byte inline)."""
    records = other = 0
    while i < end:
        key = buf[i]
        i += 1
        if key > 0x7F:
            key, i = _varint(buf, i - 1)
        if key != _RECORDS:
            i = _skip(buf, i, end, key)
            other += 1
            records += other > _FREE
        else:
            size = buf[i]
            i += 1
            if size > 0x7F:
                size, i = _varint(buf, i - 1)
            i += size
            if i > end:
                raise DecodeError("a span or log record runs past the end of its scope")
            records += 1
        if records > budget:
            return records
    return records


def _metric_points(buf: bytes, i: int, end: int, budget: int) -> int:
    """Points of one Metric: those of every data field it holds (the parser decodes each one),
    counting stopped once past ``budget``; of each point only its key and length are read."""
    points = other = 0
    while i < end:
        key = buf[i]
        i += 1
        if key > 0x7F:
            key, i = _varint(buf, i - 1)
        other += 1  # the Metric's own fields: its name, its data...
        if other > _FREE:
            points += 1
            if points > budget:
                return points
        if key not in _DATA:
            i = _skip(buf, i, end, key)
            continue
        size = buf[i]
        i += 1
        if size > 0x7F:
            size, i = _varint(buf, i - 1)
        stop = i + size
        if stop > end:
            raise DecodeError("a Metric's data runs past the end of the Metric")
        fields = 0  # the data's own fields other than its points: temporality, monotonicity
        while i < stop:
            if buf[i] == _POINTS_TAG and buf[i + 1] < 0x80:  # a point shorter than 128 bytes
                i += 2 + buf[i + 1]
                points += 1
            else:
                key, i = _varint(buf, i)
                if key == _POINTS_TAG:
                    points += 1
                else:
                    fields += 1
                    points += fields > _FREE
                i = _skip(buf, i, stop, key)
            if points > budget:
                return points
        if i != stop:
            raise DecodeError("a point runs past the end of its Metric's data")
    if i != end:
        raise DecodeError("a field runs past the end of its Metric")
    return points


def decode_attribute(encoded: bytes) -> tuple[str, Any] | None:
    """One encoded KeyValue as (key, scalar) (None for arrays, maps and bytes), or None if it
    does not decode. Never raises."""
    try:
        kv = common_pb2.KeyValue.FromString(encoded)
    except (DecodeError, RecursionError, ValueError):
        return None
    value = kv.value
    return kv.key, value.double_value or any_value(value)  # a non-zero double needs no oneof test


def decode_attributes(raw: Sequence[bytes]) -> dict[str, Any] | str:
    """A point's encoded KeyValues as ``{key: scalar}`` (``decode_attribute``), or why they do
    not decode (keys are unique in OTel: a repeated one is refused, never resolved). Never raises."""
    out: dict[str, Any] = {}
    for encoded in raw:
        found = decode_attribute(encoded)
        if found is None:
            return "undecodable point attribute"
        if found[0] in out:
            return f"point attribute {found[0][:64]!r} appears twice"
        out[found[0]] = found[1]
    return out
