"""The export thread: local backends and OTLP, off the caller's thread, bounded.

``flush`` puts a ``StepBatch`` in the inbox and returns (O(1): a lock, a counter, an append;
no wake-up while steps come faster than the export cadence, ``inbox``). This thread reads device
values (waiting on CUDA events here, never on the caller), hands reduced values to the local
backends, and sends the queued steps as OTLP requests, at most 5 a second (``_REQUEST_GAP``).

Why it retries itself: the OTel SDK exporters retry with exponential backoff *inside*
``export()`` and then drop the batch, so an endpoint outage used to lose every step while this
thread slept in the SDK's backoff. Now each send is one attempt with one deadline
(``senders``); a step that could not be sent stays held here, in order, and this thread
retries with its own capped backoff until the endpoint answers, then sends the backlog oldest
first. The bound is in steps: at most ``max_queued_steps`` flushed steps (default 300, five
minutes at one step per second) are held, queued or unsent; a flush beyond that is dropped and
counted, so only what overflows is lost. Requests the endpoint refuses for good (a
non-retryable error) are dropped and counted too. Drops are reported as a warning and in the
``rankscope.dropped_points`` metric once an export goes through again; shutdown keeps trying
until ``RANKSCOPE_SHUTDOWN_TIMEOUT`` and counts what is left.

Forked children (DataLoader workers) export through their parent: their serialized requests
arrive from ``senders.ForkRelay`` and join the same held queue (``relay``); a child's thread
exports on its parent's request at the parent's shutdown (``poll``).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.sdk.metrics import (
    Counter,
    Histogram,
    MeterProvider,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
    UpDownCounter,
)
from opentelemetry.sdk.metrics.export import AggregationTemporality, MetricReader, MetricsData
from opentelemetry.sdk.resources import Resource

from .._version import __version__
from ..backends.base import Metric
from ..core import names as attr
from ..core.errors import warn
from ..metrics.recorder import Recorder, StepBatch
from ..metrics.reduce import Reduce
from ..metrics.samples import Kept, Provenance, Row
from ..otlp.common import encode_resource
from ..otlp.logs import encode_streams
from ..otlp.samples import encode_rows
from ..otlp.spans import encode_spans
from ..otlp.templates import MetricEncoder
from ..tracing.spans import SpanBuffer
from ._otel_sdk import SdkGauge
from .captures import Captures
from .inbox import Inbox
from .local_views import BackendSet
from .senders import LOGS, SPANS, Attempt, EmbeddedSenders, RelaySenders, Senders

_STREAM_QUEUE_LIMIT = 65536
_MAX_ITEMS_PER_ROUND = 256
_MAX_SPANS_PER_REQUEST = 4096
_MAX_POINTS_PER_REQUEST = 8192
"""Held steps go out in requests of at most this many points (a step is never split), so a
backlog does not become one request beyond a receiver's message size limit (gRPC: 4 MiB)."""
_RETRY_FIRST = 0.5
_RETRY_MAX = 2.0
"""Seconds between attempts while the endpoint is down: doubling from 0.5 s, capped at 2 s
(one small request per 2 s is less than a step-per-second process sends when all is well)."""
_RETRY_AFTER_MAX = 30.0
_MAX_RELAYED_SPAN_REQUESTS = 256
_MAX_ROWS_PER_REQUEST = 512
_MAX_ROW_CHARS_PER_REQUEST = 1 << 20
"""Sample rows go out in requests of at most this many rows and characters of text (4 KiB
strings, 64 fields: one row can be 256 KiB), under a receiver's 4 MiB message limit."""
_MAX_HELD_ROWS = 65536
_REQUEST_GAP = 0.2
"""Seconds per OTLP request between export rounds (at most 5 requests a second): a round that sent
metrics and spans waits 0.4 s. Steps flushed faster than this share a request (a 20 ms training step
would otherwise pay a gRPC call per step and signal); a slower step leaves at its flush (``Inbox``)."""
_MAX_ROUND_GAP = 0.6
"""The longest wait between rounds, however many requests the last one sent: a step reaches the
endpoint within about this long of its flush (streams, rows, spans and metrics in one round would
ask 0.8 s)."""


class _PullReader(MetricReader):
    """Collects the MeterProvider's own instruments when the export thread asks (delta)."""

    def __init__(self) -> None:
        super().__init__(preferred_temporality=dict.fromkeys(_INSTRUMENT_TYPES, AggregationTemporality.DELTA))
        self._data: MetricsData | None = None

    def _receive_metrics(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> None:
        self._data = metrics_data

    def pull(self) -> MetricsData | None:
        self.collect()
        data, self._data = self._data, None
        return data

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass


_INSTRUMENT_TYPES = (
    Counter,
    UpDownCounter,
    Histogram,
    ObservableCounter,
    ObservableUpDownCounter,
    ObservableGauge,
    SdkGauge,
)


# -- messages to the export thread (one queue, handled in order) --------------------------


@dataclass(slots=True)
class _Step:
    batch: StepBatch


@dataclass(slots=True)
class _Stream:
    metric: Metric
    step: int | None


@dataclass(slots=True)
class _Row:
    table: str
    row: Row
    origin: Provenance
    step: int | None


@dataclass(slots=True)
class _Relayed:
    kind: bytes
    payload: bytes


@dataclass(slots=True)
class _Poll:
    done: Callable[[], None]


@dataclass(slots=True)
class _Sync:
    done: threading.Event


@dataclass(slots=True)
class _Stop:
    deadline: float


_Message = _Step | _Stream | _Row | _Relayed | _Poll | _Sync | _Stop


@dataclass(slots=True)
class _Round:
    """What the messages of one round of the export thread's loop asked for."""

    pending: list[StepBatch]
    """Prepared steps waiting for the next OTLP request (the loop's list, carried across rounds)."""
    synced: bool = False
    """A force_flush or a poll: try to send at once."""
    polls: list[Callable[[], None]] = field(default_factory=list)
    """Polls' callbacks, called at the end of the round."""
    deadline: float | None = None
    """Set by a stop: the shutdown deadline."""


SampleRow = tuple[str, str | None, int, Kept, int | None]
"""(table, rank_by, k, kept row, step): a sample row waiting for the endpoint."""


@dataclass(slots=True)
class _Unsent:
    """One encoded OTLP metrics request waiting for the endpoint, and what it holds."""

    request: bytes
    steps: int
    points: int
    held_points: int


class ExportThread:
    """Owns the bounded queue, the held (unsent) requests and the thread that drains them."""

    def __init__(
        self,
        *,
        resource: Resource,
        recorder: Recorder,
        backends: BackendSet,
        otlp: Senders | EmbeddedSenders | RelaySenders | None,
        export_interval: float,
        max_queued_steps: int,
        periodic: Callable[[], bool],
        on_error: Callable[[str, BaseException], None],
        stream_to_sink: bool = False,
        spans: SpanBuffer | None = None,
        captures: Captures | None = None,
    ) -> None:
        self.resource = resource
        self.captures = captures
        """Profiler captures the sink asks of this process (polled and uploaded here)."""
        self.spans = spans if spans is not None else SpanBuffer(1)
        self._spans_dropped_reported = 0
        self._spans_warned = False
        self.recorder = recorder
        self.backends = backends
        self.otlp = otlp
        self.export_interval = export_interval
        self.max_queued_steps = max_queued_steps
        self._periodic = periodic
        self._on_error = on_error
        self.stream_to_sink = stream_to_sink and otlp is not None
        self._streams: list[tuple[Metric, int | None]] = []
        self._rows: deque[SampleRow] = deque()
        """Each step's kept sample rows not encoded yet: they go before the steps' flush markers,
        so a sink has a step's rows when the step is complete."""
        self._streamed: deque[SampleRow] = deque()
        """Every recorded row, for a sink's ``per_rank_no_reduce`` views (bounded apart, so they
        never push out the selections)."""
        self._row_requests: deque[tuple[bytes, int]] = deque()
        """Encoded row requests (and their row counts) not sent yet: a retry resends the same
        bytes, so a sink recognizes a request it already took."""
        self._relayed_logs: deque[tuple[bytes, int]] = deque()
        """Forked children's serialized log requests and their record counts."""
        self._streamed_rows = 0
        self.rows_dropped = 0
        self._resource_pb = encode_resource(resource.attributes)
        self._scope = InstrumentationScope(name=attr.INSTRUMENTATION_SCOPE, version=__version__)
        self._metric_encoder = MetricEncoder(self._resource_pb, self._scope)
        self._reader = _PullReader()
        self.meter_provider = MeterProvider(resource=resource, metric_readers=[self._reader], shutdown_on_exit=False)
        meter = self.meter_provider.get_meter(attr.INSTRUMENTATION_SCOPE, __version__)
        self._dropped_counter = meter.create_counter(
            attr.DROPPED_POINTS, unit="{point}", description="points rankscope could not queue or export"
        )
        self._inbox: Inbox[_Message] = Inbox(_STREAM_QUEUE_LIMIT)
        self._lock = threading.Lock()
        self._held_steps = 0  # flushed steps not yet sent or dropped: queued, pending or unsent
        self._held_points = 0
        self.dropped_total = 0
        self._dropped_unreported = 0
        self._warned_drop = False
        # Export-thread state.
        self._unsent: deque[_Unsent] = deque()
        self._span_retry: list[Any] = []
        self._relayed_spans: deque[tuple[bytes, int]] = deque()  # forked children's span requests, span counts
        self._failures = 0
        self._next_attempt = 0.0
        self._down_since: float | None = None
        self._warned_down = False
        self._warned_unreachable = False
        self._goodbye_queued = False
        self._waiting: list[threading.Event] = []
        self._requests = 0  # sent (or tried) by the last export round
        self._handlers: dict[type[_Message], Callable[[Any, _Round], None]] = {
            _Step: self._on_step,
            _Stream: self._on_stream,
            _Row: self._on_row,
            _Poll: self._on_poll,
            _Relayed: self._on_relayed,
            _Sync: self._on_sync,
            _Stop: self._on_stop,
        }
        """The export thread's handler of each kind of message."""
        self._thread = threading.Thread(target=self._run, name="rankscope-export", daemon=True)
        self._thread.start()

    # -- caller side -------------------------------------------------------------------

    def submit(self, batch: StepBatch) -> None:
        points = batch.held_points = len(batch.accs)
        with self._lock:
            full = self._held_steps >= self.max_queued_steps
            if not full:
                self._held_steps += 1
                self._held_points += points
        if full:
            self._drop(
                points, f"{self.max_queued_steps} flushed steps are already waiting (RANKSCOPE_MAX_QUEUED_STEPS)"
            )
        elif not self._put(_Step(batch)):
            self._release(1, points)
            self._drop(points, "the export queue is full")

    def stream(self, key: str, value: float, reduce: Reduce, when: float, step: int | None) -> None:
        if not self._put(_Stream(Metric(key, value, reduce, when), step)):
            self._drop(1, "the export queue is full")

    def stream_row(self, table: str, row: Row, origin: Provenance, step: int | None) -> None:
        """A recorded sample row, for ``per_rank_no_reduce`` views (every row, not a selection)."""
        if not self._put(_Row(table, row, origin, step)):
            self._drop_rows(1, "the export queue is full")

    def relay(self, kind: bytes, payload: bytes) -> None:
        """A forked child's serialized request (the fork relay's thread): exported like our own steps."""
        if not self._put(_Relayed(kind, payload)):
            self._drop(1, "the export queue is full")

    def poll(self, done: Callable[[], None]) -> None:
        """Export what the process holds now, even unflushed values (a forked child whose parent
        shuts down), then call ``done`` on the export thread."""
        if not self._put(_Poll(done), urgent=True):
            done()

    def flush(self, timeout: float) -> bool:
        """Wait until everything queued before this call has been handled (sent, when there is an endpoint)."""
        done = threading.Event()
        self._put(_Sync(done), urgent=True)
        return done.wait(timeout)

    def shutdown(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        self._put(_Stop(deadline), urgent=True)
        self._thread.join(timeout + 1.0)  # the thread bounds its own attempts by the deadline
        if self._thread.is_alive():
            # Stuck (a local backend's finish, a send that ignores its deadline): stop the exporter.
            if self.otlp is not None:
                self.otlp.shutdown(timeout_millis=100)
            self._thread.join(1.0)
            with self._lock:
                left, self._held_points, self._held_steps = self._held_points, 0, 0
            self._drop(left, f"shutdown did not finish exporting within {timeout:.1f}s")
            self._report_drops(final=True)
        elif self.otlp is not None:
            self.otlp.shutdown()
        self.meter_provider.shutdown()

    def _put(self, item: _Message, urgent: bool = False) -> bool:
        return self._inbox.put(item, urgent)

    def _release(self, steps: int, points: int) -> None:
        with self._lock:
            self._held_steps = max(0, self._held_steps - steps)
            self._held_points = max(0, self._held_points - points)

    def _drop(self, points: int, why: str) -> None:
        with self._lock:
            self.dropped_total += points
            self._dropped_unreported += points
            first = not self._warned_drop
            self._warned_drop = True
        if first and points:
            warn(
                f"rankscope: dropping metric points because {why}; the job is unaffected "
                "and the count is reported when export recovers"
            )

    # -- export thread -----------------------------------------------------------------

    def _unsent_work(self) -> bool:
        """Requests or spans encoded or relayed but not sent yet (a failed attempt's, or a child's)."""
        return bool(
            self._unsent
            or self._span_retry
            or self._relayed_spans
            or self._rows
            or self._streamed
            or self._row_requests
            or self._relayed_logs
        )

    def _run(self) -> None:
        try:
            self.backends.init()
        except Exception as exc:
            self._on_error("backend init", exc)
        pending: list[StepBatch] = []  # prepared steps waiting for the next OTLP request
        last_export = 0.0
        deadline: float | None = None
        while deadline is None:
            wait, idle = self._wait_time(pending, last_export)
            items = self._inbox.take(wait, idle, _MAX_ITEMS_PER_ROUND)
            taken = _Round(pending)
            for item in items:
                self._handlers[type(item)](item, taken)
            deadline = taken.deadline
            if deadline is None:
                pending, last_export = self._end_round(taken, bool(items), last_export)
        self._finish(pending, deadline)

    @property
    def _round_gap(self) -> float:
        """Seconds from one export round to the next: ``_REQUEST_GAP`` per request the last one sent."""
        return min(_MAX_ROUND_GAP, _REQUEST_GAP * max(1, self._requests))

    def _wait_time(self, pending: list[StepBatch], last_export: float) -> tuple[float, bool]:
        """How long the next round waits for a message, and whether it is idle (a new step wakes it)."""
        now = time.monotonic()
        if self._failures:  # the endpoint is down: wait out the backoff (new steps keep queueing)
            return max(0.0, self._next_attempt - now), False
        if pending or self._streams or self._unsent_work():
            return max(0.0, last_export + self._round_gap - now), False
        return self.export_interval, True

    def _on_step(self, item: _Step, taken: _Round) -> None:
        self._guarded(self._prepare, item.batch)
        taken.pending.append(item.batch)

    def _on_stream(self, item: _Stream, taken: _Round) -> None:
        if self.stream_to_sink:
            self._streams.append((item.metric, item.step))
        else:
            self._guarded(self.backends.log_stream, item.metric, item.step)

    def _on_row(self, item: _Row, taken: _Round) -> None:
        if self.stream_to_sink:
            self._streamed_rows += 1
            kept = Kept(0.0, self._streamed_rows, "stream", item.row, item.origin)
            self._hold_rows(self._streamed, [(item.table, None, 1, kept, item.step)])
        else:
            self._guarded(self.backends.log_row, item.table, item.row, item.origin, item.step)

    def _on_poll(self, item: _Poll, taken: _Round) -> None:
        taken.polls.append(item.done)
        taken.synced = True
        if self._periodic():  # the parent is shutting down: what this child holds, now
            self._hold_and_prepare(self.recorder.take(None), taken.pending)

    def _on_relayed(self, item: _Relayed, taken: _Round) -> None:
        self._guarded(self._take_relayed, item.kind, item.payload)

    def _on_sync(self, item: _Sync, taken: _Round) -> None:
        self._waiting.append(item.done)
        taken.synced = True

    def _on_stop(self, item: _Stop, taken: _Round) -> None:
        taken.deadline = item.deadline

    def _hold_and_prepare(self, batch: StepBatch | None, pending: list[StepBatch]) -> None:
        """A step taken on this thread joins the bound and, if it fits, the pending steps."""
        if batch is not None and self._hold(batch):
            self._guarded(self._prepare, batch)
            pending.append(batch)

    def _end_round(self, taken: _Round, took_items: bool, last_export: float) -> tuple[list[StepBatch], float]:
        """After a round's messages: service captures, take a periodic step, send when due, answer
        flushes and polls. Returns the pending steps and the last export's time, both new after a send."""
        if self.captures is not None:
            self._guarded(self.captures.service)
        now = time.monotonic()
        pending = taken.pending
        if not took_items and not pending and not self._failures and self._periodic():
            # A process that never flushes. While the endpoint is down its values keep
            # accumulating in place (constant memory) instead of filling the queue. The
            # caller's thread takes the step when asked (``Recorder.take_periodic``); an
            # idle caller's step is taken here one interval after the ask.
            self._hold_and_prepare(self.recorder.take_periodic(grace=self.export_interval), pending)
        work = pending or self._streams or self._unsent_work() or len(self.spans)
        ready = now >= self._next_attempt or taken.synced  # a force_flush tries at once
        if work and ready and (taken.synced or now - last_export >= self._round_gap):
            self._try_cycle(pending, None, False)
            pending, last_export = [], time.monotonic()
        if not pending and not self._unsent_work():
            self._release_waiting()
        for done in taken.polls:
            self._guarded(done)
        return pending, last_export

    def _finish(self, pending: list[StepBatch], deadline: float) -> None:
        """Stop: keep trying (with the same backoff) until the shutdown deadline, then count what is left."""
        while True:
            self._try_cycle(pending, deadline, True)
            pending = []
            if not self._unsent_work():
                break
            wait = max(0.0, self._next_attempt - time.monotonic())
            if time.monotonic() + wait >= deadline - 0.05:
                break
            time.sleep(wait)
        if self._unsent_work():
            held = sum(u.held_points for u in self._unsent)
            self._release(sum(u.steps for u in self._unsent), held)
            with self._lock:
                self._warned_drop = True  # one line at exit: the count below says it all
            self._drop(sum(u.points for u in self._unsent), "shutdown ended before the endpoint answered")
            self._unsent.clear()
            self.spans.dropped += len(self._span_retry)
            self.spans.dropped += sum(n for _, n in self._relayed_spans)
            self._span_retry = []
            self._relayed_spans.clear()
            rows = len(self._rows) + len(self._streamed) + sum(n for _, n in self._row_requests)
            rows += sum(n for _, n in self._relayed_logs)
            if rows:
                self._drop_rows(rows, "shutdown ended before the endpoint answered")
            self._rows.clear()
            self._streamed.clear()
            self._row_requests.clear()
            self._relayed_logs.clear()
            self._report_drops(final=True)
        self._release_waiting()
        self._guarded(self.backends.finish)

    def _try_cycle(self, pending: list[StepBatch], deadline: float | None, goodbye: bool) -> None:
        self._requests = 0
        try:
            self._cycle(pending, deadline, goodbye)
        except Exception as exc:
            self._next_attempt = time.monotonic() + _RETRY_FIRST  # never a busy loop over a bug
            self._on_error("export", exc)

    def _take_relayed(self, kind: bytes, payload: bytes) -> None:
        """A forked child's request joins ours: metrics count in the step bound, spans in a bounded line."""
        if kind == LOGS:
            records = _records(ExportLogsServiceRequest.FromString(payload))
            if len(self._relayed_logs) >= _MAX_RELAYED_SPAN_REQUESTS:
                self._drop_rows(records, "too many relayed rows wait")
            else:
                self._relayed_logs.append((payload, records))
            return
        if kind == SPANS:
            request = ExportTraceServiceRequest.FromString(payload)
            spans = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
            if len(self._relayed_spans) >= _MAX_RELAYED_SPAN_REQUESTS:
                self.spans.dropped += spans
            else:
                self._relayed_spans.append((payload, spans))
            return
        request = ExportMetricsServiceRequest.FromString(payload)  # counted here, sent as it came
        points = sum(len(sm.metrics) for rm in request.resource_metrics for sm in rm.scope_metrics)
        with self._lock:
            full = self._held_steps >= self.max_queued_steps
            if not full:
                self._held_steps += 1
        if full:
            self._drop(points, "the export queue is full")
        else:
            self._unsent.append(_Unsent(payload, 1, points, 0))

    def _release_waiting(self) -> None:
        for done in self._waiting:
            done.set()
        self._waiting = []

    def _hold(self, batch: StepBatch) -> bool:
        """A step made on this thread (a periodic export) joins the bound like a flushed one."""
        batch.held_points = len(batch.accs)
        with self._lock:
            full = self._held_steps >= self.max_queued_steps
            if not full:
                self._held_steps += 1
                self._held_points += batch.held_points
        if full:
            self._drop(batch.held_points, "the export queue is full")
        return not full

    def _guarded(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:
            self._on_error(getattr(fn, "__name__", "export"), exc)

    def _prepare(self, batch: StepBatch) -> None:
        """Read device values and GPU-timed durations, then give the step to the local backends."""
        if batch.deferred:
            self.recorder.resolve_deferred(batch)
        if batch.device is not None:
            self.recorder.stream_device_values(batch, batch.device.values())
            batch.device = None
        self.backends.log_batch(batch)
        if batch.samples:
            self.backends.log_samples(batch)

    def _cycle(self, batches: list[StepBatch], deadline: float | None, goodbye: bool) -> None:
        """One export attempt: encode the new steps behind the held ones, then send spans, streamed
        values and metric requests, oldest first, until one fails (then back off) or all are out."""
        if self.otlp is None:  # local backends only: nothing leaves the process
            self._release(len(batches), sum(b.held_points for b in batches))
            self._recycle(batches)
            return
        try:
            self._encode(batches, goodbye)
            self._recycle(batches)
        except Exception:
            self._release(len(batches), sum(b.held_points for b in batches))
            self._drop(sum(len(b.accs) for b in batches), "a step could not be encoded")
            self._drop_rows(
                sum(len(t.distinct()) for b in batches for t in b.samples or ()), "a step could not be encoded"
            )
            raise
        failed = self._send_spans(deadline)  # before the flush markers: the sink sees a step's spans when it closes it
        if failed is None and self._streams:
            failed = self._send_streams(deadline)
        if failed is None and (self._rows or self._streamed or self._row_requests or self._relayed_logs):
            failed = self._send_rows(deadline)  # a step's sample rows, acknowledged before its marker
        while failed is None and self._unsent:
            item = self._unsent[0]
            attempt = self._attempt(self.otlp.send, item.request, deadline)
            if attempt.sent or not attempt.retry:
                self._unsent.popleft()
                self._release(item.steps, item.held_points)
                if not attempt.sent:
                    self._drop(item.points, f"the OTLP endpoint refused an export ({attempt.detail})")
            else:
                failed = attempt
        if failed is not None:
            self._failed(failed)
            return
        if self._failures and self._warned_down:
            down = time.monotonic() - (self._down_since or time.monotonic())
            logging.getLogger("rankscope").warning(
                "rankscope: %s answers again after %.1fs; the steps held meanwhile were sent",
                getattr(self.otlp, "target", "the OTLP endpoint"),
                down,
            )
            self._warned_down = False
        self._failures, self._down_since, self._next_attempt = 0, None, 0.0
        self._report_drops(final=False)

    def _recycle(self, batches: list[StepBatch]) -> None:
        """The steps' accumulators, encoded and seen by the local views, serve later steps' first
        values (``Recorder.recycle``); the batches are not read again."""
        for batch in batches:  # the newest last: the next take pops it first (its keys are the likeliest)
            self.recorder.recycle(batch.accs)
            batch.accs = {}

    def _attempt(self, send: Callable[..., Attempt], request: Any, deadline: float | None) -> Attempt:
        self._requests += 1
        timeout = None if deadline is None else max(0.001, deadline - time.monotonic())
        try:
            return send(request, timeout)
        except Exception as exc:  # e.g. the embedded sink could not start: counted, warned once
            self._warn_unreachable(exc)
            return Attempt(False, detail=repr(exc))

    def _failed(self, attempt: Attempt) -> None:
        """The endpoint did not take a request it may take later: keep everything, retry after a backoff."""
        self._failures += 1
        backoff = min(_RETRY_MAX, _RETRY_FIRST * 2 ** (self._failures - 1)) * random.uniform(0.8, 1.2)
        if attempt.retry_after is not None:
            backoff = min(max(backoff, attempt.retry_after), _RETRY_AFTER_MAX)
        now = time.monotonic()
        self._next_attempt = now + backoff
        if self._down_since is None:
            self._down_since = now
        if not self._warned_down:  # a log line, not a warning: nothing is lost (yet)
            self._warned_down = True
            logging.getLogger("rankscope").warning(
                "rankscope: %s does not take exports now (%s); flushed steps wait for it (up to %d, "
                "RANKSCOPE_MAX_QUEUED_STEPS) and go out when it answers; the job is unaffected",
                getattr(self.otlp, "target", "the OTLP endpoint"),
                attempt.detail,
                self.max_queued_steps,
            )

    def _encode(self, batches: list[StepBatch], goodbye: bool) -> None:
        """Append the steps as OTLP requests of at most ``_MAX_POINTS_PER_REQUEST`` points to the unsent queue."""
        # A forked child (relayed) is never waited for by a sink: no goodbye to say.
        goodbye = goodbye and not self._goodbye_queued and not isinstance(self.otlp, RelaySenders)
        if not batches and not goodbye:
            return
        sdk_data = self._reader.pull()  # the SDK MeterProvider's own instruments (dropped points)
        before = bytes(encode_metrics(sdk_data).SerializeToString()) if sdk_data is not None else b""
        encoder = self._metric_encoder
        made: list[_Unsent] = []  # all or nothing: a step that fails to encode drops the round, counted once
        metrics: list[bytes] = []
        steps = points = held = 0
        for batch in batches:
            if points and points + len(batch.accs) > _MAX_POINTS_PER_REQUEST:
                made.append(_Unsent(encoder.request(metrics, before), steps, points, held))
                metrics, before, steps, points, held = [], b"", 0, 0, 0
            t0, t1 = batch.start_time_unix_nano, batch.time_unix_nano
            metrics += encoder.step(batch.step, t0, t1, batch.accs)
            if batch.step is not None:  # "this process closed step N" (value: number of keys)
                metrics.append(encoder.marker(batch.step, len(batch.accs), t0, t1, batch.expected, batch.driven))
            steps, points, held = steps + 1, points + len(batch.accs), held + batch.held_points
            time.sleep(0)  # hand the GIL back to the training thread between steps
        if goodbye:  # "this process is done: stop waiting for its steps"
            metrics.append(encoder.goodbye())
        if metrics or before:
            made.append(_Unsent(encoder.request(metrics, before), steps, points, held))
        self._unsent.extend(made)
        for batch in batches:
            if batch.samples:
                rows = [(t.table, t.rank_by, t.k, kept, batch.step) for t in batch.samples for kept in t.distinct()]
                self._hold_rows(self._rows, rows)
        self._goodbye_queued = self._goodbye_queued or goodbye

    def _send_spans(self, deadline: float | None) -> Attempt | None:
        """Send the span buffer (a chunk a failed attempt left first). Returns the failed attempt
        when the endpoint should be tried again later; refused spans are counted."""
        assert self.otlp is not None
        while self._relayed_spans:
            attempt = self._attempt(self.otlp.send_spans, self._relayed_spans[0][0], deadline)
            if attempt.retry and not attempt.sent:
                return attempt
            _, n = self._relayed_spans.popleft()
            if not attempt.sent:
                self.spans.dropped += n
        records = self._span_retry or self.spans.drain(_MAX_SPANS_PER_REQUEST)
        self._span_retry = []
        sent = False
        while records:
            request = bytes(encode_spans(records, self._resource_pb, self._scope).SerializeToString())
            attempt = self._attempt(self.otlp.send_spans, request, deadline)
            if attempt.retry and not attempt.sent:
                self._span_retry = records  # the buffer behind it stays bounded (its overflow is counted)
                return attempt
            if attempt.sent:
                sent = True
            else:
                self.spans.dropped += len(records)
                if not self._spans_warned:
                    self._spans_warned = True
                    warn(f"rankscope: dropping spans: the OTLP endpoint refused them ({attempt.detail})")
            records = self.spans.drain(_MAX_SPANS_PER_REQUEST)
        if sent and self.spans.dropped > self._spans_dropped_reported:  # a send went through: report what was lost
            n = self.spans.dropped - self._spans_dropped_reported
            self._spans_dropped_reported = self.spans.dropped
            self._spans_warned = False
            warn(f"rankscope: {n} spans were dropped ({self.spans.dropped} in total)")
        return None

    def _send_streams(self, deadline: float | None) -> Attempt | None:
        assert self.otlp is not None
        streams = self._streams
        attempt = self._attempt(self.otlp.send_logs, self._logs_request(streams), deadline)
        if attempt.sent:
            self._streams = []
            return None
        if attempt.retry:
            over = len(streams) - _STREAM_QUEUE_LIMIT
            if over > 0:
                del streams[:over]
                self._drop(over, "too many streamed values wait for the endpoint")
            return attempt
        self._streams = []
        self._drop(len(streams), f"the OTLP endpoint refused streamed values ({attempt.detail})")
        return None

    def _hold_rows(self, held: deque[SampleRow], rows: list[SampleRow]) -> None:
        held.extend(rows)
        over = len(held) - _MAX_HELD_ROWS
        if over > 0:
            for _ in range(over):
                held.popleft()
            self._drop_rows(over, f"{_MAX_HELD_ROWS} sample rows already wait for the endpoint")

    def _drop_rows(self, n: int, why: str) -> None:
        """Rows lost: counted with the dropped points (``rs.dropped_points``, the metric), warned once."""
        if n <= 0:
            return
        first = not self.rows_dropped
        self.rows_dropped += n
        with self._lock:
            self.dropped_total += n
            self._dropped_unreported += n
        if first:
            warn(f"rankscope: dropping sample rows because {why}; the job is unaffected (counted as dropped points)")

    def _next_row_request(self) -> bool:
        """Encode the next chunk of held rows (selections first) into ``_row_requests``."""
        held = self._rows or self._streamed
        if not held:
            return False
        chunk: list[SampleRow] = []
        chars = 0
        while held and len(chunk) < _MAX_ROWS_PER_REQUEST:
            row = held[0][3].row
            size = sum(len(v) for v in row.values() if isinstance(v, str)) + 16 * len(row)
            if chunk and chars + size > _MAX_ROW_CHARS_PER_REQUEST:
                break
            chunk.append(held.popleft())
            chars += size
        try:
            request = encode_rows(chunk, self._resource_pb, self._scope)
            self._row_requests.append((bytes(request.SerializeToString()), len(chunk)))
        except Exception:  # a bug, not the endpoint: these rows are lost, counted, the rest go on
            self._drop_rows(len(chunk), "they could not be encoded")
            raise
        return True

    def _send_rows(self, deadline: float | None) -> Attempt | None:
        """Send relayed and held sample rows in bounded requests, oldest first; a failed attempt
        keeps its request (and the metric requests behind it) for the next one."""
        assert self.otlp is not None
        while self._relayed_logs:
            attempt = self._attempt(self.otlp.send_logs, self._relayed_logs[0][0], deadline)
            if attempt.retry and not attempt.sent:
                return attempt
            _, n = self._relayed_logs.popleft()
            if not attempt.sent:
                self._drop_rows(n, f"the OTLP endpoint refused them ({attempt.detail})")
        while self._row_requests or self._next_row_request():
            request, n = self._row_requests[0]
            attempt = self._attempt(self.otlp.send_logs, request, deadline)
            if attempt.retry and not attempt.sent:
                return attempt
            self._row_requests.popleft()
            if not attempt.sent:
                self._drop_rows(n, f"the OTLP endpoint refused them ({attempt.detail})")
        return None

    def _warn_unreachable(self, exc: Exception) -> None:
        if not self._warned_unreachable:
            self._warned_unreachable = True
            warn(f"rankscope: no sink could be reached ({exc}); metrics are counted as dropped")

    def _logs_request(self, streams: list[tuple[Metric, int | None]]) -> bytes:
        values = ((m.key, m.value, m.timestamp, step) for m, step in streams)
        return bytes(encode_streams(values, self._resource_pb, self._scope).SerializeToString())

    def _report_drops(self, final: bool) -> None:
        with self._lock:
            n, self._dropped_unreported = self._dropped_unreported, 0
            self._warned_drop = False
        if n:
            self._dropped_counter.add(n)
            if final:
                target = getattr(self.otlp, "target", "the OTLP endpoint")
                state = f"at shutdown: {target} did not take them within RANKSCOPE_SHUTDOWN_TIMEOUT"
            else:
                state = "before export recovered"
            warn(f"rankscope: {n} metric points were dropped {state} ({self.dropped_total} in total)")


def _records(request: Any) -> int:
    return sum(len(sl.log_records) for rl in request.resource_logs for sl in rl.scope_logs)
