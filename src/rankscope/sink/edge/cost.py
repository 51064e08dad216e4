"""What one OTLP request may cost the sink, judged before any of it is decoded: the bounds of
``checked.Limits`` that refuse a request whole, and its weight in the sink's gate (``edge.gate``).

Decoding allocates per message and the edge's checks run per point, span or log record, so a
4 MB body of two-byte empty points (or spans) is two million of each. A body is therefore walked
first (``otlp.raw.walk_metrics``, ``walk_records``): its resources and units (points; spans or log
records) are counted down to each unit's length, never into one, and the walk stops at the first
bound passed. Past ``max_resources`` or the units' bound (``max_points``; ``max_records``) the
request is refused whole (``RefusedError`` of kind COSTLY: sent again it is refused again); past
``max_experiments`` once its Resources are checked, before any unit is (``experiments_within``).

A request within its bounds weighs its units in the gate before it is decoded (``Weigh``); when the
sink's budget of points in flight is spent it is refused whole, retry-later (``OverloadedError`` of
kind CAPACITY). The walk stops at the room the gate has left, so a refusal costs the sink no more
than that room however large the body, and a body too short to exceed its share of the budget is
not counted at all. A span or a log record weighs ``RECORD_WEIGHT`` points: the sink does that much
more for each (checks every field, keeps it, writes it).

Nothing is taken before these checks, so each refusal is safe for any signal: points are known by
their digests on a retry, spans and log records are not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, Protocol, TypeVar

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from ...otlp.raw import (
    EncodedLogs,
    EncodedMetrics,
    EncodedTraces,
    ParsedMetrics,
    Walked,
    metrics_at,
    walk_metrics,
    walk_records,
)
from ..checked import Limits, Refusals
from .errors import Kind, OverloadedError, RefusedError

RECORD_WEIGHT = 4
"""Points a span or a log record weighs in the gate: what the sink spends on one (its checks, its
stored form) against a point's. Measured in one process on the 2-core VM: 6 to 11 µs a span or log
record taken, 4.7 µs an empty plain point (the cheapest point to send, and the dearest to take);
a kept span holds about 1 KB, a point's row about 100 bytes."""


class Weigh(Protocol):
    """What the edge asks of the gate for one call (``edge.gate.Call``)."""

    share: int
    """Points a call may weigh whatever else is in flight."""

    def room(self) -> int:
        """The most points the call may weigh now."""
        ...

    def weigh(self, points: int) -> bool:
        """Hold ``points`` until the call ends, or False when they do not fit now."""
        ...


_T = TypeVar("_T")
OnCostly = Callable[[Refusals], None]
"""Told of a request refused whole for what it costs (the sink's tally: the status route counts it)."""


@contextmanager
def counted(refused: Refusals, on_costly: OnCostly | None) -> Iterator[None]:
    """A request refused whole for what it costs (COSTLY, CAPACITY) inside is told to ``on_costly``."""
    try:
        yield
    except RefusedError as exc:
        if exc.kind in (Kind.COSTLY, Kind.CAPACITY) and on_costly is not None:
            on_costly(refused)
        raise


def metrics_within(request: Any, limits: Limits, refused: Refusals, gate: Weigh | None = None) -> ParsedMetrics:
    """An ``ExportMetricsServiceRequest``'s ResourceMetrics, decoded once its walk found it within the
    bounds and ``gate`` took its weight (as the transports hand it on: ``otlp.raw.EncodedMetrics``;
    bytes or a message alike; a list is decoded already: a test's, a tool's)."""
    if isinstance(request, list):
        return request
    body = _body(request)
    walked = _walked(body, walk_metrics, limits.max_points, "points", 1, limits, refused, gate)
    return _decoded(lambda: metrics_at(body, walked.spans))


def traces_within(request: Any, limits: Limits, refused: Refusals, gate: Weigh | None = None) -> Any:
    """An ``ExportTraceServiceRequest`` decoded once within the bounds (``metrics_within``; as the
    transports hand it on: ``otlp.raw.EncodedTraces``)."""
    return _records(request, ExportTraceServiceRequest, "spans", limits, refused, gate)


def logs_within(request: Any, limits: Limits, refused: Refusals, gate: Weigh | None = None) -> Any:
    """An ``ExportLogsServiceRequest`` decoded once within the bounds (``otlp.raw.EncodedLogs``)."""
    return _records(request, ExportLogsServiceRequest, "log records", limits, refused, gate)


def experiments_within(
    named: set[str], experiment: str, limits: Limits, refused: Refusals, units: Callable[[], int]
) -> None:
    """Add ``experiment`` to those a request names; past ``max_experiments`` the request is refused
    whole, its ``units()`` counted, before any of them is checked. More than one client may hold runs
    open (``RunLimits.per_client``), so such a request would be refused in part anyway."""
    named.add(experiment)
    if len(named) > limits.max_experiments:
        why = f"request naming more than {limits.max_experiments} experiments (limit max_experiments)"
        costly(refused, units(), why)


def costly(refused: Refusals, units: int, why: str) -> NoReturn:
    """Refuse the whole request, before any of it is taken: its ``units`` (as far as they were
    counted) and why, in ``refused`` for the status route; the client is told to split it."""
    why += "; not taken, split it"
    refused.received = max(refused.received, units)
    refused.add(max(1, units), why)
    raise RefusedError(Kind.COSTLY, why)


def _busy(refused: Refusals, units: int) -> NoReturn:
    """Refuse the whole request for now, its ``units`` counted (as far as the walk went): the sink's
    budget of points in flight has not room enough left (CAPACITY)."""
    why = "request over what the sink has room for now (limit max_points_in_flight); retry"
    refused.received = max(refused.received, units)
    refused.add(max(1, units), why)
    raise OverloadedError(Kind.CAPACITY, why)


def _body(request: Any) -> bytes:
    if isinstance(request, (EncodedMetrics, EncodedTraces, EncodedLogs)):
        return request.body
    return request if isinstance(request, bytes) else bytes(request.SerializeToString())


def _records(request: Any, cls: Any, noun: str, limits: Limits, refused: Refusals, gate: Weigh | None) -> Any:
    """A traces or logs request (``cls``) decoded once within the bounds (a message: as it is)."""
    body = _body(request)
    _walked(body, walk_records, limits.max_records, noun, RECORD_WEIGHT, limits, refused, gate)
    return request if isinstance(request, cls) else _decoded(lambda: cls.FromString(body))


def _decoded(decode: Callable[[], _T]) -> _T:
    """What ``decode`` returns; a body the walk took but the parser does not (a malformed field
    inside a unit, which the walk never reads) is answered as undecodable."""
    try:
        return decode()
    except (DecodeError, RecursionError, ValueError) as exc:
        raise RefusedError(Kind.BAD_REQUEST, f"undecodable OTLP request: {exc}") from None


def _walked(
    body: bytes,
    walk: Callable[..., Walked],
    bound: int,
    noun: str,
    weight: int,
    limits: Limits,
    refused: Refusals,
    gate: Weigh | None,
) -> Walked:
    """The walk of a body within ``bound`` units (each weighing ``weight`` points) and the room
    ``gate`` has for it, then its weight held; raises ``RefusedError`` (BAD_REQUEST, COSTLY) or
    ``OverloadedError`` (CAPACITY) with nothing of it decoded."""
    name = "max_points" if noun == "points" else "max_records"
    room = bound if gate is None else min(bound, max(1, gate.room() // weight))
    # a body that cannot exceed its share of the budget (two bytes a unit at least) is not counted
    count = gate is not None and len(body) // 2 * weight > gate.share
    try:
        walked = walk(body, limits.max_resources, room, count=count)
    except (DecodeError, RecursionError, ValueError) as exc:
        raise RefusedError(Kind.BAD_REQUEST, f"undecodable OTLP request: {exc}") from None
    if walked.over == "points" and room < bound:  # past the room left, not (yet) past its bound
        _busy(refused, walked.points)
    if walked.over == "points":
        costly(refused, walked.points, f"request of more than {bound} {noun} (limit {name})")
    if walked.over == "resources":
        units = walked.points if walked.points >= 0 else walk(body, 1 << 62, bound, count=True).points
        costly(refused, units, f"request of more than {limits.max_resources} resources (limit max_resources)")
    units = walked.points if walked.points >= 0 else len(body) // 2  # not counted: within its share
    if gate is not None and not gate.weigh(units * weight):
        _busy(refused, units)
    return walked
