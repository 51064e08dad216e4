"""Streamed raw values (``per_rank_no_reduce`` views in a sink) as OTLP log records, both ways.

Each value is one INFO record with ``rankscope.key``, ``rankscope.value`` and, once the
process has flushed a step, ``rankscope.step``. Ordinary log records (no ``rankscope.key``)
are any OTel client's: a sink writes them to the experiment's views (``decode_record``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from ..core import names as attr
from .common import any_value, decode_step, key_value

if TYPE_CHECKING:
    from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord

_INFO = 9


def encode_streams(
    streams: Iterable[tuple[str, float, float | None, int | None]], resource: Any, scope: Any
) -> ExportLogsServiceRequest:
    """One request for (key, value, unix time, step) values of one process."""
    request = ExportLogsServiceRequest()
    records = request.resource_logs.add(resource=resource).scope_logs.add(scope=scope)
    for key, value, when, step in streams:
        record = records.log_records.add(
            time_unix_nano=int((when or time.time()) * 1e9), severity_number=_INFO, severity_text="INFO"
        )
        record.body.string_value = f"{key}: {value}"
        record.attributes.extend([key_value(attr.STREAM_KEY, key), key_value(attr.STREAM_VALUE, float(value))])
        if step is not None:
            record.attributes.append(key_value(attr.STEP, step))
    return request


def is_stream(record_attributes: dict[str, Any]) -> bool:
    return attr.STREAM_KEY in record_attributes


def decode_stream(record_attributes: dict[str, Any]) -> tuple[str, float, int | None] | str:
    """(key, value, step) of a streamed value, or why it is refused (the key's text is the caller's to check)."""
    key, value = record_attributes.get(attr.STREAM_KEY), record_attributes.get(attr.STREAM_VALUE)
    step = decode_step(record_attributes.get(attr.STEP))
    if not isinstance(key, str):
        return "streamed value with a bad key"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"streamed {key[:64]!r} has no numeric {attr.STREAM_VALUE}"
    if isinstance(step, str):
        return f"streamed {key[:64]!r}: {step}"
    return key, float(value), step


_SEVERITIES = ((21, "FATAL"), (17, "ERROR"), (13, "WARN"), (9, "INFO"), (5, "DEBUG"), (1, "TRACE"))
MAX_BODY_CHARS = 4096
MAX_RECORD_ATTRIBUTES = 32


def severity_of(record: LogRecord) -> str:
    """The record's severity text, else the name of its severity number's range (OTel's), else UNSPECIFIED."""
    text = record.severity_text
    if text:
        return text[:32]
    number = record.severity_number
    return next((name for low, name in _SEVERITIES if number >= low), "UNSPECIFIED")


def decode_record(record: Any, record_attributes: dict[str, Any]) -> tuple[int, str, str, dict[str, Any], Any, str]:
    """(time, severity, body, attributes, step or why it is bad, trace id) of an ordinary record:
    the body and attributes cut to bounded sizes (a cut body ends in "…")."""
    body = any_value(record.body) if record.HasField("body") else None
    text = "" if body is None else str(body)
    if len(text) > MAX_BODY_CHARS:
        text = text[:MAX_BODY_CHARS] + "…"
    step = decode_step(record_attributes.pop(attr.STEP, None))
    kept = {
        k[:128]: v if not isinstance(v, str) or len(v) <= 512 else v[:512] + "…"
        for k, v in list(record_attributes.items())[:MAX_RECORD_ATTRIBUTES]
        if v is not None
    }
    when = record.time_unix_nano or record.observed_time_unix_nano
    return when, severity_of(record), text, kept, step, record.trace_id.hex() if len(record.trace_id) == 16 else ""
