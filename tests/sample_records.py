"""Sample rows as log records, built by hand to be changed field by field (``tests/*/test_samples_edge.py``)."""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord

from rankscope.core import names as attr
from rankscope.otlp.common import key_value


def record(row: dict[str, Any] | None = None, **tags: Any) -> LogRecord:
    """A well-formed "top" row of table ``t`` (rank_by ``reward``, k=2), changed by ``tags``
    (None removes an attribute; ``body`` replaces the body)."""
    out = LogRecord(time_unix_nano=1, trace_id=b"\1" * 16, span_id=b"\2" * 8)
    body = tags.pop("body", None)
    if body is not None:
        out.body.CopyFrom(body)
    else:
        for name, value in (row if row is not None else {"reward": 1.0, "text": "hi"}).items():
            out.body.kvlist_value.values.add(key=name, value=any_value(value))
    given_tags = {
        attr.SAMPLE_TABLE: "t",
        attr.SAMPLE_SIDE: "top",
        attr.SAMPLE_KEY: 1.0,
        attr.SAMPLE_SEQ: 0,
        attr.SAMPLE_K: 2,
        attr.SAMPLE_RANK_BY: "reward",
    }
    given_tags.update({attr.STEP: 0})
    for name, value in {**given_tags, **tags}.items():
        if value is not None:
            out.attributes.append(key_value(name, value))
    return out


def any_value(value: Any) -> AnyValue:
    return key_value("x", value).value
