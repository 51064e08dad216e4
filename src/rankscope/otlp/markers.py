"""Step markers: "this process closed step N" and "this process is done", as metric points.

A flush marker is one Sum point named ``rankscope.flush`` per closed step (value: the number of
keys; a Monarch controller adds how many processes it flushed, an actor that its controller
closed the step). A goodbye (``rankscope.goodbye``) is sent once at shutdown, so a sink stops
waiting for the process's steps.

A Collector's merge processor merges the markers of one (role, replica, world size) group into a
*rank set* (``rankscope.flush.ranks``: "these ranks closed step N", the ranks as ascending ranges),
so the sink learns who closed a step from one point per group, not one per process (``Ranks``).
"""

from __future__ import annotations

import time
import unicodedata
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


def add_goodbye(scope: Any, exit_error: str | None = None, step: int | None = None) -> None:
    """The process is done; ``exit_error``: the exception that ended it (``Type: message``), in
    ``step`` (the one it was in: ``current_step``)."""
    bye = scope.metrics.add(name=attr.GOODBYE)
    bye.sum.aggregation_temporality = _DELTA
    point = bye.sum.data_points.add(time_unix_nano=time.time_ns(), as_int=1)
    if exit_error:
        point.attributes.append(key_value(attr.EXIT_ERROR, exit_error[:EXIT_ERROR_CHARS]))
        if step is not None:
            point.attributes.append(key_value(attr.STEP, step))


MAX_WORLD_SIZE = 1 << 20
"""The largest group a rank set may describe (a million ranks)."""
MAX_SPANS = 1 << 16
"""Ranges in one rank set at most (a merger splits a set with more into several points)."""


@dataclass(frozen=True, slots=True)
class Ranks:
    """The ranks of one (role, replica) group of ``world_size`` that a merged marker says closed its step."""

    role: str
    replica: str | None
    world_size: int
    spans: tuple[tuple[int, int], ...]
    """Inclusive ranges, ascending and apart: ((0, 7), (9, 9)) is ranks 0-7 and 9."""

    @property
    def count(self) -> int:
        return sum(b - a + 1 for a, b in self.spans)

    def record(self) -> tuple[str, str | None, int, tuple[tuple[int, int], ...]]:
        """As a write-ahead-log record holds it (``Ranks(*record)`` reads it back)."""
        return (self.role, self.replica, self.world_size, self.spans)


def format_spans(spans: tuple[tuple[int, int], ...]) -> str:
    """``((0, 7), (9, 9))`` as ``"0-7,9"``: the form ``rankscope.ranks`` travels in."""
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def parse_spans(text: str, world_size: int) -> tuple[tuple[int, int], ...] | str:
    """``"0-7,9"`` as ``((0, 7), (9, 9))``, or why it is refused: each range within ``[0,
    world_size)``, ascending, apart, at most ``MAX_SPANS`` of them. Never raises."""
    parts = text.split(",", MAX_SPANS)
    if len(parts) > MAX_SPANS:
        return f"{attr.RANKS} holds more than {MAX_SPANS} ranges"
    spans: list[tuple[int, int]] = []
    last = -2
    for part in parts:
        low, dash, high = part.partition("-")
        digits = low.isascii() and low.isdigit() and (not dash or (high.isascii() and high.isdigit()))
        if not digits or len(low) > 7 or len(high) > 7:  # a rank is below MAX_WORLD_SIZE: 7 digits
            return f"{attr.RANKS} {text[:40]!r}: {part[:20]!r} is not a rank or a range"
        a = int(low)
        b = int(high) if dash else a
        if not last + 1 < a <= b < world_size:  # apart from the last range: "0-3,4" is written "0-4"
            return f"{attr.RANKS} {text[:40]!r}: {part[:20]!r} is not ascending, apart and below {world_size}"
        spans.append((a, b))
        last = b
    return tuple(spans)


def _clean(text: Any) -> bool:
    """A role or replica a merged marker may name: 1 to 256 characters, none a control, format,
    private or unassigned one (what the sink's edge takes in a resource)."""
    if not isinstance(text, str) or not 0 < len(text) <= 256:
        return False
    return text.isprintable() or not any(unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn") for c in text)


def decode_ranks(point_attributes: dict[str, Any], time_unix_nano: int = 0, start_unix_nano: int = 0) -> Marker | str:
    """A merged marker's meaning (``rankscope.flush.ranks``), or why it is refused."""
    step = decode_step(point_attributes.get(attr.STEP))
    if isinstance(step, str) or step is None:
        return f"bad merged flush marker ({step or 'no step'})"
    role, replica = point_attributes.get(attr.ROLE), point_attributes.get(attr.REPLICA)
    size, text = point_attributes.get(attr.WORLD_SIZE), point_attributes.get(attr.RANKS)
    if not isinstance(role, str) or not _clean(role):
        return f"bad merged flush marker ({attr.ROLE} {str(role)[:32]!r})"
    if replica is not None and not _clean(replica):
        return f"bad merged flush marker ({attr.REPLICA} {str(replica)[:32]!r})"
    if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= MAX_WORLD_SIZE:
        return f"bad merged flush marker ({attr.WORLD_SIZE} {str(size)[:32]!r}; at most {MAX_WORLD_SIZE})"
    if not isinstance(text, str) or not text:
        return f"bad merged flush marker (no {attr.RANKS})"
    spans = parse_spans(text, size)
    if isinstance(spans, str):
        return f"bad merged flush marker ({spans})"
    return Marker(step, 0, False, time_unix_nano, Ranks(role, replica, size, spans), start_unix_nano)


@dataclass(frozen=True, slots=True)
class Marker:
    step: int
    expected: int
    driven: bool
    time_unix_nano: int = 0
    """When the process closed the step (its clock): the step's wall-clock window ends here."""
    ranks: Ranks | None = None
    """A merged marker's ranks (``rankscope.flush.ranks``): the ranks closed the step, not its sender."""
    start_unix_nano: int = 0
    """When the step began for its closer (its previous flush, else its start): a run's first step
    is timed from it."""

    def record(self) -> tuple[Any, ...]:
        """As a write-ahead-log record holds it (``Marker.of_record`` reads it back)."""
        fields = (self.step, self.expected, self.driven, self.time_unix_nano)
        ranks = None if self.ranks is None else self.ranks.record()
        if self.start_unix_nano:
            return (*fields, ranks, self.start_unix_nano)
        return fields if ranks is None else (*fields, ranks)

    @classmethod
    def of_record(cls, fields: Any) -> Marker:
        """A marker from ``record``'s tuple (five fields before starts, four before rank sets,
        three before times)."""
        step, expected, driven, *rest = fields
        ranks = None
        if len(rest) > 1 and rest[1] is not None:
            role, replica, size, spans = rest[1]
            ranks = Ranks(role, replica, size, tuple((a, b) for a, b in spans))
        return cls(step, expected, driven, rest[0] if rest else 0, ranks, rest[2] if len(rest) > 2 else 0)


def decode_marker(point_attributes: dict[str, Any], time_unix_nano: int = 0, start_unix_nano: int = 0) -> Marker | str:
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
    driven = point_attributes.get(attr.DRIVEN) is True
    return Marker(step, expected, driven, time_unix_nano, None, start_unix_nano)
