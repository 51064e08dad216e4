"""Pure OTLP/HTTP request handling: content types, gzip with a size cap, OTLP/JSON.

No sockets here: ``decode_body`` turns (path, headers, body) into a protobuf request or an
``HttpError`` carrying the kind of refusal (``edge.errors`` answers it), so the transport stays
thin and the rules are tested without a server.
"""

from __future__ import annotations

import base64
import json
import zlib
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest, ExportLogsServiceResponse
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from ...otlp.raw import parse_logs, parse_metrics, parse_traces
from .errors import HttpError, Kind

PROTOBUF = "application/x-protobuf"
JSON = "application/json"

SIGNALS: dict[str, tuple[str, type[Message], type[Message]]] = {
    "/v1/metrics": ("metrics", ExportMetricsServiceRequest, ExportMetricsServiceResponse),
    "/v1/traces": ("traces", ExportTraceServiceRequest, ExportTraceServiceResponse),
    "/v1/logs": ("logs", ExportLogsServiceRequest, ExportLogsServiceResponse),
}

_ENCODED = {"metrics": parse_metrics, "traces": parse_traces, "logs": parse_logs}

# OTLP/JSON writes trace and span ids as hex; protobuf's JSON mapping expects base64.
_ID_FIELDS = frozenset({"traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"})


@dataclass(frozen=True, slots=True)
class Decoded:
    signal: str
    request: Any
    """A protobuf request; over protobuf, the body still encoded (``otlp.raw.parse_metrics``,
    ``parse_traces``, ``parse_logs``): the sink's edge decodes it once it counted what it costs."""
    response_class: type[Message]
    json: bool


def media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def decode_body(
    path: str, content_type: str | None, content_encoding: str | None, body: bytes, max_bytes: int
) -> Decoded:
    """Decode one OTLP/HTTP request body; raises ``HttpError`` with the kind of refusal."""
    found = SIGNALS.get(path.split("?", 1)[0].rstrip("/"))
    if found is None:
        raise HttpError(Kind.NO_ROUTE, f"no OTLP signal at {path!r}; use /v1/metrics, /v1/traces or /v1/logs")
    signal, request_class, response_class = found
    kind = media_type(content_type)
    if kind not in (PROTOBUF, JSON):
        raise HttpError(Kind.UNSUPPORTED_MEDIA, f"unsupported content type {content_type!r}; use {PROTOBUF} or {JSON}")
    body = decompress(body, content_encoding, max_bytes)
    request: Any = request_class()
    try:
        if kind == PROTOBUF:
            request = _ENCODED[signal](body)  # decoded by the sink's edge under its bounds (``edge.cost``)
        else:
            json_format.ParseDict(hex_ids_to_base64(json.loads(body)), request, ignore_unknown_fields=True)
    except (DecodeError, json_format.ParseError, ValueError, TypeError, RecursionError) as exc:
        raise HttpError(Kind.BAD_REQUEST, f"undecodable {signal} body: {exc}") from None
    return Decoded(signal, request, response_class, kind == JSON)


def decompress(body: bytes, content_encoding: str | None, max_bytes: int) -> bytes:
    """Undo gzip/deflate, refusing to inflate past ``max_bytes`` (gzip bombs get 413). A gzip body
    may hold several members (RFC 1952), each inflated in turn; bytes after the last are refused."""
    encoding = (content_encoding or "identity").strip().lower()
    if encoding == "identity":
        return body
    if encoding not in ("gzip", "deflate"):
        raise HttpError(
            Kind.UNSUPPORTED_MEDIA, f"unsupported content encoding {content_encoding!r}; use gzip or identity"
        )
    out = bytearray()
    rest = body
    for _ in range(MAX_GZIP_MEMBERS):
        inflater = zlib.decompressobj(wbits=47 if encoding == "gzip" else 15)  # 47: gzip or zlib header
        try:
            out += inflater.decompress(rest, max_bytes + 1 - len(out))
        except zlib.error as exc:
            raise HttpError(Kind.BAD_REQUEST, f"corrupt {encoding} body: {exc}") from None
        if len(out) > max_bytes or inflater.unconsumed_tail:
            raise HttpError(Kind.TOO_LARGE, f"body inflates past the {max_bytes}-byte limit")
        if not inflater.eof:
            raise HttpError(Kind.BAD_REQUEST, f"truncated {encoding} body")
        rest = inflater.unused_data
        if not rest:
            return bytes(out)
        if encoding != "gzip":
            raise HttpError(Kind.BAD_REQUEST, f"{len(rest)} bytes after the end of the {encoding} stream")
    raise HttpError(Kind.BAD_REQUEST, f"gzip body of more than {MAX_GZIP_MEMBERS} members")


MAX_GZIP_MEMBERS = 64
"""Members one gzip body may hold (each costs a fresh inflater)."""


def hex_ids_to_base64(node: Any) -> Any:
    """Rewrite OTLP/JSON's hex ids into the base64 that protobuf's JSON parser reads."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key in _ID_FIELDS and isinstance(value, str):
                try:
                    value = base64.b64encode(bytes.fromhex(value)).decode()
                except ValueError:
                    raise ValueError(f"{key} {value!r} is not hex") from None
            else:
                value = hex_ids_to_base64(value)
            out[key] = value
        return out
    if isinstance(node, list):
        return [hex_ids_to_base64(v) for v in node]
    return node


def encode_response(decoded: Decoded, response: Message) -> tuple[str, bytes]:
    """The response in the request's encoding (OTLP: answer JSON with JSON)."""
    if decoded.json:
        return JSON, json_format.MessageToJson(response, indent=None).encode()
    return PROTOBUF, response.SerializeToString()


def encode_status(message: str, code: int, json_body: bool) -> tuple[str, bytes]:
    """An error body: ``google.rpc.Status``, as OTLP/HTTP asks."""
    from google.rpc.status_pb2 import Status

    status = Status(code=code, message=message)
    if json_body:
        return JSON, json_format.MessageToJson(status, indent=None).encode()
    return PROTOBUF, status.SerializeToString()
