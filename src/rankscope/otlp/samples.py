"""Sample-table rows (``record_sample``) as OTLP log records, both ways.

One record per row: the row is the body (an OTel ``kvlist``), the provenance is where OTel
puts it (the record's time, trace id and span id) plus ``rankscope.policy_version`` and
``rankscope.step``, and ``rankscope.sample.*`` attributes say which table it belongs to, how
the table selects (``rank_by``, ``k``), why this row travels (``side``) and its ranking
``key`` (the ``rank_by`` value, or its random priority) so a sink merges without re-reading
the row. Any OTel client can send rows this way; a sink checks them like everything else.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from ..core import names as attr
from ..metrics.samples import MAX_FIELDS, MAX_K, SIDES, Kept, Provenance, Row, check_row
from .common import INT64_MAX, decode_step, key_value

_INFO = 9
MAX_FIELD_NAME_CHARS = 128


def is_sample(record_attributes: dict[str, Any]) -> bool:
    return attr.SAMPLE_TABLE in record_attributes


def _value(value: str | int | float | bool) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, str):
        return AnyValue(string_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    return AnyValue(double_value=value)


def encode_rows(
    rows: Iterable[tuple[str, str | None, int, Kept, int | None]], resource: Any, scope: Any
) -> ExportLogsServiceRequest:
    """One request for (table, rank_by, k, kept row, step) of one process; the row's ``origin``
    is its ``Provenance``."""
    request = ExportLogsServiceRequest()
    records = request.resource_logs.add(resource=resource).scope_logs.add(scope=scope).log_records
    for table, rank_by, k, kept, step in rows:
        origin: Provenance = kept.origin
        record = records.add(time_unix_nano=origin.time_unix_nano, severity_number=_INFO, severity_text="INFO")
        if origin.trace_id:
            record.trace_id = origin.trace_id.to_bytes(16, "big")
            record.span_id = origin.span_id.to_bytes(8, "big")
        fields = record.body.kvlist_value.values
        for name, value in kept.row.items():
            fields.add(key=name, value=_value(value))
        tags = [
            key_value(attr.SAMPLE_TABLE, table),
            key_value(attr.SAMPLE_SIDE, kept.side),
            key_value(attr.SAMPLE_SEQ, kept.seq),
            key_value(attr.SAMPLE_K, k),
        ]
        if kept.side != "stream":
            tags.append(key_value(attr.SAMPLE_KEY, float(kept.key)))
        if rank_by is not None:
            tags.append(key_value(attr.SAMPLE_RANK_BY, rank_by))
        if step is not None:
            tags.append(key_value(attr.STEP, step))
        if origin.policy_version is not None:
            tags.append(key_value(attr.POLICY_VERSION, origin.policy_version))
        record.attributes.extend(tags)
    return request


@dataclass(frozen=True, slots=True)
class SampleRow:
    """A checked row of a sample table, as a sink takes it."""

    table: str
    rank_by: str | None
    k: int
    side: str
    key: float
    seq: int
    row: Row
    step: int | None
    time_unix_nano: int
    trace_id: str
    span_id: str
    policy_version: int | None


def _body(record: Any) -> dict[str, Any] | str:
    if record.body.WhichOneof("value") != "kvlist_value":
        return "the body is not a map of fields"
    values = record.body.kvlist_value.values
    if len(values) > MAX_FIELDS:
        return f"{len(values)} fields (limit {MAX_FIELDS})"
    row: dict[str, Any] = {}
    for kv in values:
        kind = kv.value.WhichOneof("value")
        if kind not in ("string_value", "bool_value", "int_value", "double_value"):
            return f"field {kv.key[:64]!r} is not a str, int, float or bool"
        if not kv.key or len(kv.key) > MAX_FIELD_NAME_CHARS or not kv.key.isprintable():
            return "a field name is empty, too long or has control characters"
        row[kv.key] = getattr(kv.value, kind)
    return row


def decode_row(record: Any, a: dict[str, Any], max_chars: int) -> SampleRow | str:
    """A sample record's row, or why it is refused (never raises: client data)."""
    table = a.get(attr.SAMPLE_TABLE)
    if not isinstance(table, str) or not table:
        return "sample row: bad table name"
    tags = _decode_tags(a)
    if isinstance(tags, str):
        return f"sample row of {table[:64]!r}: {tags}"
    side, k, rank_by, key, seq, step, version = tags
    body = _body(record)
    if isinstance(body, str):
        return f"sample row of {table[:64]!r}: {body}"
    try:
        row = check_row(table, body, max_chars)
    except (TypeError, ValueError) as exc:
        return str(exc)[:200]
    if side in ("top", "bottom", "both"):
        mismatch = _rank_mismatch(row, rank_by, key)
        if mismatch is not None:
            return f"sample row of {table[:64]!r}: {mismatch}"
    trace_id = record.trace_id.hex() if len(record.trace_id) == 16 else ""
    span_id = record.span_id.hex() if len(record.span_id) == 8 and trace_id else ""
    when = record.time_unix_nano or record.observed_time_unix_nano
    return SampleRow(table, rank_by, k, side, float(key), seq, row, step, when, trace_id, span_id, version)


_Tags = tuple[str, int, str | None, float, int, int | None, int | None]
"""(side, k, rank_by, key, seq, step, policy version) of a sample record."""


def _decode_tags(a: dict[str, Any]) -> _Tags | str:
    """A sample record's attributes other than its table, or why they are refused (in the table's words)."""
    side, k = a.get(attr.SAMPLE_SIDE), a.get(attr.SAMPLE_K)
    if side not in SIDES:
        return f"side must be one of {', '.join(SIDES)}"
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        return f"{attr.SAMPLE_K} must be an int in [1, {MAX_K}]"
    rank_by = a.get(attr.SAMPLE_RANK_BY)
    if rank_by is not None and (not isinstance(rank_by, str) or not rank_by):
        return f"bad {attr.SAMPLE_RANK_BY}"
    key = a.get(attr.SAMPLE_KEY, 0.0) if side != "stream" else 0.0  # a streamed row is not ranked
    ranking = _check_ranking(side, key, rank_by)
    if ranking is not None:
        return ranking
    order = _decode_order(a)
    if isinstance(order, str):
        return order
    return (side, k, rank_by, key, *order)


def _check_ranking(side: str, key: Any, rank_by: str | None) -> str | None:
    """Why a row's ranking key and ``rank_by`` do not fit its side, if they do not."""
    if isinstance(key, bool) or not isinstance(key, (int, float)):
        return f"{attr.SAMPLE_KEY} must be a number"
    if side == "sample" and not 0.0 <= key < 1.0:
        return "a random priority must be in [0, 1)"
    if side in ("top", "bottom", "both") and rank_by is None:
        return f"side {side} without {attr.SAMPLE_RANK_BY}"
    if side == "sample" and rank_by is not None:
        return f"a random-sample row with {attr.SAMPLE_RANK_BY}"
    if rank_by is not None and (len(rank_by) > MAX_FIELD_NAME_CHARS or not rank_by.isprintable()):
        return f"{attr.SAMPLE_RANK_BY} is too long or has control characters"
    return None


def _decode_order(a: dict[str, Any]) -> tuple[int, int | None, int | None] | str:
    """(seq, step, policy version) of a sample record, or why they are refused."""
    seq = a.get(attr.SAMPLE_SEQ, 0)
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq <= INT64_MAX:
        return f"{attr.SAMPLE_SEQ} must be a non-negative int"
    step = decode_step(a.get(attr.STEP))
    if isinstance(step, str):
        return step
    version = a.get(attr.POLICY_VERSION)
    if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 0):
        return f"{attr.POLICY_VERSION} must be a non-negative int"
    return seq, step, version


def _rank_mismatch(row: Row, rank_by: str | None, key: float) -> str | None:
    """Why a ranked row's ``rank_by`` field is not its ranking key, if it is not."""
    value = row.get(rank_by)  # type: ignore[arg-type]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"rank_by field {rank_by!r} is not a number in the row"
    same = float(value) == float(key) or (math.isnan(float(value)) and math.isnan(float(key)))
    if not same:
        return f"{attr.SAMPLE_KEY} is not the row's {rank_by!r}"
    return None
