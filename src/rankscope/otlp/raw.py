"""OTLP metric requests whose points keep their attributes as raw bytes.

One process's request repeats a handful of attribute lists (``{rankscope.reduce,
rankscope.step}``) over hundreds of points, and a sink takes a thousand such requests per
step. Turning every ``KeyValue`` into a message and a dict costs more than the rest of the
ingest path together, so the sink parses requests with ``RawExportMetricsServiceRequest``: the
OTLP message with the same field numbers (wire-identical), except that every data point's
``attributes`` is declared ``repeated bytes``. Each point then yields its encoded KeyValues as
bytes, and an identical list is decoded once (the sink's edge caches what it means).

``parse_metrics`` goes one level further up: it keeps each ResourceMetrics' bytes as they
arrived next to its parsed message, so a sink can fingerprint what a process sent (to know a
retry) without encoding it again.

Built at import from the OTLP package's own descriptors, in private descriptor pools.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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


def parse_metrics(body: bytes) -> ParsedMetrics:
    """An encoded ``ExportMetricsServiceRequest``, parsed; raises ``DecodeError`` if it is not one."""
    split = _SplitRequest.FromString(body)
    return [(encoded, RawResourceMetrics.FromString(encoded)) for encoded in split.resource_metrics]


def resource_metrics(request: Any) -> ParsedMetrics:
    """``parse_metrics`` of a request in any form: already parsed, bytes, or any message of it."""
    if isinstance(request, list):
        return request
    return parse_metrics(request if isinstance(request, bytes) else request.SerializeToString())


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
