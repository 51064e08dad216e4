"""Attributes, resources and steps on the wire, both ways."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from ..core import names as attr

if TYPE_CHECKING:
    from opentelemetry.proto.metrics.v1.metrics_pb2 import NumberDataPoint

INT64_MAX = 2**63 - 1


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


def any_value(value: Any) -> Any:
    """A scalar ``AnyValue`` as Python; None for arrays, maps, bytes and empty values."""
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind in ("string_value", "bool_value", "int_value", "double_value") else None


def attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in kvs}


def decode_step(value: Any) -> int | str | None:
    """A ``rankscope.step`` attribute: an int64 >= 0, None when absent, or why it is refused."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{attr.STEP} must be an integer, got {type(value).__name__}"
    if not 0 <= value <= INT64_MAX:
        return f"{attr.STEP} {value} is negative"
    return value


def number(point: NumberDataPoint) -> float | int:
    """A NumberDataPoint's value."""
    return point.as_double if point.WhichOneof("value") == "as_double" else point.as_int
