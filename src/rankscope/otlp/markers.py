"""Step markers: "this process closed step N" and "this process is done", as metric points.

A flush marker is one Sum point named ``rankscope.flush`` per closed step (value: the number of
keys; a Monarch controller adds how many processes it flushed, an actor that its controller
closed the step). A goodbye (``rankscope.goodbye``) is sent once at shutdown, so a sink stops
waiting for the process's steps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb

from ..core import names as attr
from .common import decode_step, key_value

_DELTA = pb.AGGREGATION_TEMPORALITY_DELTA


def add_flush_marker(
    scope: Any,
    step_attributes: list[KeyValue],
    keys: int,
    start_time_unix_nano: int,
    time_unix_nano: int,
    expected: int = 0,
    driven: bool = False,
) -> None:
    """Append step N's marker to ``scope`` (``step_attributes`` holds ``rankscope.step``)."""
    marker = scope.metrics.add(name=attr.FLUSH_MARKER, unit="{key}")
    marker.sum.aggregation_temporality = _DELTA
    marker.sum.is_monotonic = True
    point = marker.sum.data_points.add(
        start_time_unix_nano=start_time_unix_nano,
        time_unix_nano=time_unix_nano,
        as_int=keys,
        attributes=step_attributes,
    )
    if expected:
        point.attributes.append(key_value(attr.EXPECTED_PROCESSES, expected))
    if driven:
        point.attributes.append(key_value(attr.DRIVEN, True))


EXIT_ERROR_CHARS = 200
"""What a goodbye says of the exception that ended its process, at most."""


def add_goodbye(scope: Any, exit_error: str | None = None) -> None:
    """The process is done; ``exit_error``: the exception that ended it (``Type: message``)."""
    bye = scope.metrics.add(name=attr.GOODBYE)
    bye.sum.aggregation_temporality = _DELTA
    point = bye.sum.data_points.add(time_unix_nano=time.time_ns(), as_int=1)
    if exit_error:
        point.attributes.append(key_value(attr.EXIT_ERROR, exit_error[:EXIT_ERROR_CHARS]))


@dataclass(frozen=True, slots=True)
class Marker:
    step: int
    expected: int
    driven: bool
    time_unix_nano: int = 0
    """When the process closed the step (its clock): the step's wall-clock window ends here."""


def decode_marker(point_attributes: dict[str, Any], time_unix_nano: int = 0) -> Marker | str:
    """A flush marker point's meaning, or why it is refused."""
    step = decode_step(point_attributes.get(attr.STEP))
    expected = point_attributes.get(attr.EXPECTED_PROCESSES, 0)
    if expected is None:
        expected = 0
    if isinstance(step, str):
        return f"bad flush marker ({step})"
    if step is None:
        return "bad flush marker (no step)"
    if isinstance(expected, bool) or not isinstance(expected, int) or not 0 <= expected < 2**31:
        return f"bad flush marker ({attr.EXPECTED_PROCESSES} {str(expected)[:32]!r})"
    return Marker(step, expected, point_attributes.get(attr.DRIVEN) is True, time_unix_nano)
