"""Streamed raw values (``per_rank_no_reduce`` views in a sink) as OTLP log records, both ways.

Each value is one INFO record with ``rankscope.key``, ``rankscope.value`` and, once the
process has flushed a step, ``rankscope.step``. Ordinary log records (no ``rankscope.key``)
are somebody else's: a sink accepts and ignores them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from ..core import names as attr
from .common import decode_step, key_value

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
