"""The export path's outboxes: one per kind of outgoing data, each with its queue, bound and drop reason.

An export round asks each outbox, in ``ORDER``, to send what it holds, oldest first; the first
that fails in a way that may work later stops the round (``Endpoint.failed`` schedules the next),
so nothing overtakes what it should follow. The order is the sink's: a step's spans and sample
rows are taken before the metrics request that carries its flush marker (the sink closes the step
on the marker). A request that failed is resent as the same bytes, so a sink recognizes one it
already took. Adding a signal means one class here and its place in ``ORDER``.
"""

from __future__ import annotations

import itertools
import threading
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from ..backends.base import Metric
from ..metrics.recorder import StepBatch
from ..metrics.samples import Kept, Provenance, Row
from ..otlp.logs import encode_streams
from ..otlp.samples import encode_rows
from ..otlp.templates import MetricEncoder, SpanEncoder
from ..tracing.spans import SpanBuffer, SpanRecord
from .drops import Drops
from .encode import Encoded, SampleRow, encode_steps, row_chunk
from .endpoint import Endpoint
from .senders import Attempt, Signal

Q = TypeVar("Q")

MAX_RELAYED_REQUESTS = 256
"""Forked children's span or row requests held per outbox (their metrics count in the step bound)."""


class StepBound:
    """At most ``max_steps`` flushed steps held (queued, waiting to be encoded, or unsent); any thread."""

    def __init__(self, max_steps: int) -> None:
        self.max_steps = max_steps
        self._lock = threading.Lock()
        self._steps = 0
        self._points = 0
        self.handed = 0
        """Steps callers handed over without the lock (``ExportThread.hand_off``): the last value of
        ``_handing`` a caller read (an atomic ``next``, so two threads flushing at once lose no count;
        one may store its value after the other's larger one, for a moment)."""
        self._handing = itertools.count(1)
        self.returned = 0
        """Of those, the ones the inbox refused (full), counted as ``handed`` is (``_returning``)."""
        self._returning = itertools.count(1)
        self.received = 0
        """Of those, the ones the export thread took in (``hold_received``); only it writes it."""

    def hand(self) -> None:
        """(A caller.) One more step handed over."""
        self.handed = next(self._handing)

    def hand_back(self) -> None:
        """(A caller.) A handed step the inbox did not take."""
        self.returned = next(self._returning)

    def _in_flight(self) -> int:
        """Steps handed over and not yet taken in (a step being taken in counts twice for a moment,
        never zero times: ``hold_received``)."""
        return self.handed - self.returned - self.received

    def has_room(self) -> bool:
        """Room for one more step, counting those handed over and not yet taken in (lock-free: a caller's)."""
        return self.handed - self.returned - self.received + self._steps < self.max_steps  # ``_in_flight``, inlined

    def hold(self, points: int) -> bool:
        """Count a step in, or False when ``max_steps`` are held already (handed over ones too)."""
        with self._lock:
            if self._steps + self._in_flight() >= self.max_steps:
                return False
            self._steps += 1
            self._points += points
            return True

    def hold_received(self, points: int) -> None:
        """(Export thread.) A handed-over step is taken in: held, whatever the count (its caller
        found room)."""
        with self._lock:
            self._steps += 1  # before ``received``: a caller reading in between counts it twice
            self._points += points
        self.received += 1

    def release(self, steps: int, points: int) -> None:
        with self._lock:
            self._steps = max(0, self._steps - steps)
            self._points = max(0, self._points - points)

    def clear(self) -> int:
        """Forget everything held (a shutdown that could not finish); the points it held."""
        with self._lock:
            points, self._points, self._steps = self._points, 0, 0
            return points


def send_oldest_first(
    endpoint: Endpoint,
    signal: Signal,
    queue: deque[Q],
    deadline: float | None,
    payload: Callable[[Q], bytes],
    done: Callable[[Q, Attempt], None],
) -> Attempt | None:
    """Send ``queue``'s requests oldest first. One the endpoint may take later stops the round and stays
    first (resent as the same bytes); each other leaves the queue through ``done`` (sent or refused)."""
    while queue:
        attempt = endpoint.attempt(signal, payload(queue[0]), deadline)
        if attempt.retry and not attempt.sent:
            return attempt
        done(queue.popleft(), attempt)
    return None


class Outbox(ABC):
    """One kind of outgoing data: what it holds, how it sends it, what it counts as lost."""

    signal: ClassVar[Signal]

    @abstractmethod
    def held(self) -> bool:
        """Anything waiting for the endpoint (a ``force_flush`` waits until nothing is)."""

    def fresh(self) -> bool:
        """New data that starts an export round without being held yet (spans in their buffer)."""
        return False

    @abstractmethod
    def send(self, endpoint: Endpoint, deadline: float | None) -> Attempt | None:
        """Send what is held, oldest first; the failed attempt when the endpoint should be tried
        again later (what it held stays), else None (sent, or refused for good and counted)."""

    @abstractmethod
    def abandon(self, why: str) -> None:
        """Shutdown ended before the endpoint took it all: count what is left as lost."""


class SpanOutbox(Outbox):
    """Spans from the span buffer (rankscope's and the user's SDK spans) and forked children's span requests."""

    signal = "spans"
    MAX_SPANS_PER_REQUEST = 4096

    def __init__(self, buffer: SpanBuffer, drops: Drops, encoder: SpanEncoder) -> None:
        self._buffer = buffer
        self._drops = drops
        self._encoder = encoder
        self._retry: list[SpanRecord] = []
        """The chunk a failed attempt left (the buffer behind it stays bounded; its overflow is counted)."""
        self._relayed: deque[tuple[bytes, int]] = deque()

    def relay(self, payload: bytes) -> None:
        """A forked child's span request (kept as it came), or counted when too many wait."""
        request = ExportTraceServiceRequest.FromString(payload)
        n = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        if len(self._relayed) >= MAX_RELAYED_REQUESTS:
            self._buffer.dropped += n
        else:
            self._relayed.append((payload, n))

    def held(self) -> bool:
        return bool(self._retry or self._relayed)

    def fresh(self) -> bool:
        return len(self._buffer) > 0

    def send(self, endpoint: Endpoint, deadline: float | None) -> Attempt | None:
        failed = send_oldest_first(endpoint, self.signal, self._relayed, deadline, _payload, self._relayed_done)
        if failed is not None:
            return failed
        records = self._retry or self._buffer.drain(self.MAX_SPANS_PER_REQUEST)
        self._retry = []
        sent = False
        while records:
            request = self._encoder.request(records)  # type: ignore[arg-type]  # SpanRecords are SpanLike
            attempt = endpoint.attempt(self.signal, request, deadline)
            if attempt.retry and not attempt.sent:
                self._retry = records
                return attempt
            if attempt.sent:
                sent = True
            else:
                self._drops.lose_spans(len(records), attempt.detail)
            records = self._buffer.drain(self.MAX_SPANS_PER_REQUEST)
        if sent:
            self._drops.spans_went_through()
        return None

    def _relayed_done(self, item: tuple[bytes, int], attempt: Attempt) -> None:
        if not attempt.sent:
            self._buffer.dropped += item[1]

    def abandon(self, why: str) -> None:
        self._buffer.dropped += len(self._retry) + sum(n for _, n in self._relayed)
        self._retry = []
        self._relayed.clear()


class StreamOutbox(Outbox):
    """Streamed raw values (``per_rank_no_reduce`` views in a sink), as OTLP log records, in
    requests of at most ``LIMIT`` values; at most ``LIMIT`` more wait behind a request the endpoint
    has not taken (the oldest of them are dropped and counted)."""

    signal = "logs"
    LIMIT = 65536

    def __init__(self, drops: Drops, resource: Any, scope: Any) -> None:
        self._drops = drops
        self._resource, self._scope = resource, scope
        self._values: list[tuple[Metric, int | None]] = []
        self._frozen: tuple[bytes, int] | None = None
        """The request a failed attempt left (resent as the same bytes) and how many values it holds."""

    def add(self, metric: Metric, step: int | None) -> None:
        self._values.append((metric, step))

    def held(self) -> bool:
        return bool(self._values or self._frozen)

    def send(self, endpoint: Endpoint, deadline: float | None) -> Attempt | None:
        while self._frozen is not None or self._values:
            if self._frozen is None:
                values, self._values = self._values[: self.LIMIT], self._values[self.LIMIT :]
                rows = ((m.key, m.value, m.timestamp, step) for m, step in values)
                request = encode_streams(rows, self._resource, self._scope)
                self._frozen = (bytes(request.SerializeToString()), len(values))
            payload, n = self._frozen
            attempt = endpoint.attempt(self.signal, payload, deadline)
            if attempt.retry and not attempt.sent:
                over = len(self._values) - self.LIMIT
                if over > 0:
                    del self._values[:over]
                    self._drops.points(over, "too many streamed values wait for the endpoint")
                return attempt
            self._frozen = None
            if attempt.sent:
                self._drops.taken()
            else:
                self._drops.points(n, f"the OTLP endpoint refused streamed values ({attempt.detail})")
        return None

    def abandon(self, why: str) -> None:
        left = len(self._values) + (self._frozen[1] if self._frozen is not None else 0)
        self._drops.points(left, why, warn_first=False)
        self._values, self._frozen = [], None


class RowOutbox(Outbox):
    """Sample rows: each step's kept rows (selections first), every recorded row for
    ``per_rank_no_reduce`` views (bounded apart, so they never push out the selections), and forked
    children's row requests."""

    signal = "logs"
    MAX_HELD_ROWS = 65536

    def __init__(self, drops: Drops, resource: Any, scope: Any) -> None:
        self._drops = drops
        self._resource, self._scope = resource, scope
        self._selected: deque[SampleRow] = deque()
        self._streamed: deque[SampleRow] = deque()
        self._streamed_rows = 0
        self._requests: deque[tuple[bytes, int]] = deque()
        """Encoded requests not sent yet, with their row counts: a retry resends the same bytes."""
        self._relayed: deque[tuple[bytes, int]] = deque()

    def select(self, batch: StepBatch) -> None:
        """A step's kept rows (before the step's flush marker leaves)."""
        rows = [(t.table, t.rank_by, t.k, kept, batch.step) for t in batch.samples or () for kept in t.distinct()]
        self._hold(self._selected, rows)

    def stream(self, table: str, row: Row, origin: Provenance, step: int | None) -> None:
        self._streamed_rows += 1
        kept = Kept(0.0, self._streamed_rows, "stream", row, origin)
        self._hold(self._streamed, [(table, None, 1, kept, step)])

    def relay(self, payload: bytes) -> None:
        request = ExportLogsServiceRequest.FromString(payload)
        n = sum(len(sl.log_records) for rl in request.resource_logs for sl in rl.scope_logs)
        if len(self._relayed) >= MAX_RELAYED_REQUESTS:
            self._drops.lose_rows(n, "too many relayed rows wait")
        else:
            self._relayed.append((payload, n))

    def held(self) -> bool:
        return bool(self._selected or self._streamed or self._requests or self._relayed)

    def send(self, endpoint: Endpoint, deadline: float | None) -> Attempt | None:
        failed = send_oldest_first(endpoint, self.signal, self._relayed, deadline, _payload, self._done)
        while failed is None and (self._requests or self._next_request()):
            failed = send_oldest_first(endpoint, self.signal, self._requests, deadline, _payload, self._done)
        return failed

    def _done(self, item: tuple[bytes, int], attempt: Attempt) -> None:
        if attempt.sent:
            self._drops.taken()
        else:
            self._drops.lose_rows(item[1], f"the OTLP endpoint refused them ({attempt.detail})")

    def abandon(self, why: str) -> None:
        n = len(self._selected) + len(self._streamed)
        n += sum(k for _, k in self._requests) + sum(k for _, k in self._relayed)
        self._drops.lose_rows(n, why)
        self._selected.clear()
        self._streamed.clear()
        self._requests.clear()
        self._relayed.clear()

    def _hold(self, held: deque[SampleRow], rows: list[SampleRow]) -> None:
        held.extend(rows)
        over = len(held) - self.MAX_HELD_ROWS
        if over > 0:
            for _ in range(over):
                held.popleft()
            self._drops.lose_rows(over, f"{self.MAX_HELD_ROWS} sample rows already wait for the endpoint")

    def _next_request(self) -> bool:
        """Encode the next chunk of held rows (selections first)."""
        chunk = row_chunk(self._selected or self._streamed)
        if not chunk:
            return False
        try:
            request = encode_rows(chunk, self._resource, self._scope)
        except Exception:  # a bug, not the endpoint: these rows are lost, counted, the rest go on
            self._drops.lose_rows(len(chunk), "they could not be encoded")
            raise
        self._requests.append((bytes(request.SerializeToString()), len(chunk)))
        return True


class MetricOutbox(Outbox):
    """Flushed steps as metric requests (each step with its flush marker), and forked children's."""

    signal = "metrics"

    def __init__(self, drops: Drops, bound: StepBound, encoder: MetricEncoder) -> None:
        self._drops = drops
        self._bound = bound
        self._encoder = encoder
        self._unsent: deque[Encoded] = deque()
        self.exit_error: str | None = None
        """The exception that ended the process, said with its goodbye (set before the shutdown)."""
        self.exit_step: int | None = None
        """The step it was in then."""
        self._encoded_until = 0
        """The end of the last step encoded: the next one's points start there at the earliest."""

    def add_steps(self, batches: list[StepBatch], goodbye: bool, pause: Callable[[], None] | None = None) -> None:
        """Encode the steps (all or none: a step that cannot be encoded raises, and nothing is added)."""
        before = self._drops.sdk_request()
        made = encode_steps(
            self._encoder,
            batches,
            goodbye,
            before,
            pause=pause,
            exit_error=self.exit_error,
            exit_step=self.exit_step,
            after=self._encoded_until,
        )
        self._unsent.extend(made)
        if batches:
            self._encoded_until = batches[-1].time_unix_nano

    def relay(self, payload: bytes) -> None:
        """A forked child's request: held in the step bound like one of our steps, sent as it came."""
        request = ExportMetricsServiceRequest.FromString(payload)
        points = sum(len(sm.metrics) for rm in request.resource_metrics for sm in rm.scope_metrics)
        if self._bound.hold(0):
            self._unsent.append(Encoded(payload, 1, points, 0))
        else:
            self._drops.points(points, "the export queue is full")

    def held(self) -> bool:
        return bool(self._unsent)

    def send(self, endpoint: Endpoint, deadline: float | None) -> Attempt | None:
        return send_oldest_first(endpoint, self.signal, self._unsent, deadline, _request, self._done)

    def _done(self, item: Encoded, attempt: Attempt) -> None:
        self._bound.release(item.steps, item.held_points)
        if attempt.sent:
            self._drops.taken()
        else:
            self._drops.points(item.points, f"the OTLP endpoint refused an export ({attempt.detail})")

    def abandon(self, why: str) -> None:
        self._bound.release(sum(u.steps for u in self._unsent), sum(u.held_points for u in self._unsent))
        self._drops.points(sum(u.points for u in self._unsent), why, warn_first=False)  # the count at exit says it
        self._unsent.clear()


def _payload(item: tuple[bytes, int]) -> bytes:
    return item[0]


def _request(item: Encoded) -> bytes:
    return item.request
