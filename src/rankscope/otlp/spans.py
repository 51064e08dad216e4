"""Spans as OTLP protobuf objects: rankscope's span records (``tracing.spans.SpanRecord``) into one request.

The export path encodes spans as bytes (``templates.SpanEncoder``, from the span outbox in
``export.outboxes``); a span with events, links or an error status is built here, field by field
(``add_span``), and ``encode_spans`` is the reference the byte encoder is held to by a property
test. A sink reads the same fields back (``sink.book.traces``) with ``common.attributes``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1 import trace_pb2

from .common import key_value


class SpanLike(Protocol):
    """What the codec reads of a span record (``tracing.spans.SpanRecord``)."""

    @property
    def name(self) -> str: ...

    @property
    def trace_id(self) -> int: ...

    @property
    def span_id(self) -> int: ...

    @property
    def parent_id(self) -> int: ...

    @property
    def kind(self) -> int: ...

    @property
    def start_time(self) -> int: ...

    @property
    def end_time(self) -> int: ...

    @property
    def attributes(self) -> Mapping[str, Any] | None: ...

    @property
    def events(self) -> Sequence[tuple[str, int, Mapping[str, Any]]] | None: ...

    @property
    def error(self) -> str | None: ...


def attribute_value(v: Any) -> Any:
    """An attribute value as OTLP carries it: str, bool, int, float, or its text."""
    return v if isinstance(v, (str, bool, int, float)) else str(v)


def encode_spans(records: Iterable[SpanLike], resource: Any, scope: Any) -> ExportTraceServiceRequest:
    """One OTLP request for a process's spans, as protobuf objects (``templates.SpanEncoder`` writes
    the same request as bytes, and is held to it by a property test)."""
    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add(resource=resource).scope_spans.add(scope=scope).spans
    for r in records:
        add_span(spans, r)
    return request


def add_span(spans: Any, r: SpanLike) -> Any:
    """Append ``r`` to a repeated ``Span`` field; the new span."""
    span = spans.add(
        trace_id=r.trace_id.to_bytes(16, "big"),
        span_id=r.span_id.to_bytes(8, "big"),
        name=r.name,
        kind=r.kind,
        start_time_unix_nano=r.start_time,
        end_time_unix_nano=r.end_time,
    )
    if r.parent_id:
        span.parent_span_id = r.parent_id.to_bytes(8, "big")
    if r.attributes:
        span.attributes.extend(key_value(k, attribute_value(v)) for k, v in r.attributes.items())
    if r.events:
        for name, when, attrs in r.events:
            event = span.events.add(name=name, time_unix_nano=when)
            event.attributes.extend(key_value(k, attribute_value(v)) for k, v in attrs.items())
    links = getattr(r, "links", None)  # rankscope's spans; an OTel SDK span's links are not carried
    if links:
        for trace_id, span_id in links:
            span.links.add(trace_id=trace_id.to_bytes(16, "big"), span_id=span_id.to_bytes(8, "big"))
    if r.error is not None:
        span.status.code = trace_pb2.Status.STATUS_CODE_ERROR
        span.status.message = r.error
    return span
