"""The export thread: it schedules; the parts do the work.

``flush`` puts a ``StepBatch`` in the ``inbox`` and returns (O(1): a lock, a counter, an append;
no wake-up while steps come faster than the export cadence). This thread reads device values
(waiting on CUDA events here, never on the caller), hands reduced values to the local backends,
and runs export rounds: the new steps are encoded (``encode``, bytes from per-key templates), then
each outbox (``outboxes``: spans, streamed values, sample rows, metrics, in the sink's order) sends
what it holds through the ``Endpoint`` (a ``Sender`` and one backoff). Rounds are spaced 0.2 s per
request they sent, up to 0.6 s (5 requests a second per process in a training loop, which sends
metrics and spans): steps flushed faster share a request, and a slower step leaves at its flush.

Why it retries itself: the OTel SDK exporters retry with exponential backoff *inside*
``export()`` and then drop the batch, so an endpoint outage used to lose every step while this
thread slept in the SDK's backoff. Here each send is one attempt with one deadline (``senders``);
what could not be sent stays in its outbox, in order, and the next round comes after the
endpoint's backoff, then sends the backlog oldest first. The bound is in steps: at most
``max_queued_steps`` flushed steps (default 300, five minutes at one step per second) are held,
queued or unsent (``StepBound``); a flush beyond that is dropped and counted, so only what
overflows is lost. Everything lost is counted in one place (``drops``) and reported as a warning
and in the ``rankscope.dropped_points`` metric once an export goes through again; shutdown keeps
trying until ``RANKSCOPE_SHUTDOWN_TIMEOUT`` and counts what is left.

Forked children (DataLoader workers) export through their parent: their serialized requests
arrive from ``senders.ForkRelay`` and join the outbox of their signal (``relay``); a child's
thread exports on its parent's request at the parent's shutdown (``poll``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.sdk.resources import Resource

from .._version import __version__
from ..backends.base import Metric
from ..core import names as attr
from ..metrics.recorder import Recorder, StepBatch
from ..metrics.reduce import Reduce
from ..metrics.samples import Provenance, Row
from ..otlp.common import encode_resource
from ..otlp.templates import MetricEncoder, SpanEncoder
from ..tracing.spans import SpanBuffer
from ..tracing.tracer import phase_spans
from .captures import Captures
from .drops import Drops
from .endpoint import Endpoint
from .inbox import Inbox
from .local_views import BackendSet
from .outboxes import MetricOutbox, Outbox, RowOutbox, SpanOutbox, StepBound, StreamOutbox
from .senders import SIGNALS, EmbeddedSender, RelaySender, Sender

_INBOX_LIMIT = 65536
_MAX_ITEMS_PER_ROUND = 256
_REQUEST_GAP = 0.2
"""Seconds per OTLP request between export rounds (5 requests a second, up to ``_MAX_ROUND_GAP``): a
round that sent metrics and spans waits 0.4 s. Steps flushed faster than this share a request (a 20 ms training step
would otherwise pay a gRPC call per step and signal); a slower step leaves at its flush (``Inbox``).
Longer gaps pay gRPC less often but cost the training thread more than they save the export thread
(0.5 s a request, at most 1 s: the training thread's calls +33 µs a 20 ms step, the export thread
−20 µs, ``bench_peers.py`` on the 2-core VM, 2026-11-27)."""
_MAX_ROUND_GAP = 0.6
"""The longest wait between rounds, however many requests the last one sent: a step reaches the
endpoint within about this long of its flush (streams, rows, spans and metrics in one round would
ask 0.8 s)."""
OWNED_SINK_DRAIN = 30.0
"""Seconds a shutdown keeps retrying a sink this job owns while it is alive but has not taken what
this process holds (a busy box): past ``RANKSCOPE_SHUTDOWN_TIMEOUT``, counted from when the sink was ready."""


# -- messages to the export thread (one inbox, handled in order) --------------------------


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
    asked: float
    """When shutdown asked (``time.monotonic``)."""
    timeout: float
    """``RANKSCOPE_SHUTDOWN_TIMEOUT``: how long the drain tries the endpoint."""

    @property
    def deadline(self) -> float:
        return self.asked + self.timeout


_Message = StepBatch | _Stream | _Row | _Relayed | _Poll | _Sync | _Stop
"""A flushed step is its own message (one object less on the caller's thread)."""


@dataclass(slots=True)
class _Round:
    """What the messages of one round of the export thread's loop asked for."""

    pending: list[StepBatch]
    """Prepared steps waiting for the next export round (the loop's list, carried across rounds)."""
    synced: bool = False
    """A force_flush or a poll: try to send at once."""
    polls: list[Callable[[], None]] = field(default_factory=list)
    """Polls' callbacks, called at the end of the round."""
    stop: _Stop | None = None
    """Set by a stop: the shutdown's drain follows."""


class _Pause:
    """Between encoded steps, hands the GIL back to the training thread once ``every`` seconds of
    encoding have passed since the round began or the last hand-back. Handing it back after every
    step left each step to be encoded on caches the training thread had just used (~25 % more of
    the export thread's CPU per step, ``bench_overhead.py``). A training thread that wants the GIL
    while steps are encoded waits about 0.5 ms at most (one step's encoding more; the round's spans
    and sends are not paused, as before; Python's own switch interval is 5 ms)."""

    __slots__ = ("_every", "_since")

    def __init__(self, every: float = 0.0005) -> None:
        self._every = every
        self._since = time.perf_counter()

    def __call__(self) -> None:
        if time.perf_counter() - self._since >= self._every:
            time.sleep(0)
            self._since = time.perf_counter()


class ExportThread:
    """The inbox, the outboxes and the thread that moves steps from one to the others."""

    def __init__(
        self,
        *,
        resource: Resource,
        recorder: Recorder,
        backends: BackendSet,
        sender: Sender | None,
        export_interval: float,
        max_queued_steps: int,
        periodic: Callable[[], bool],
        on_error: Callable[[str, BaseException], None],
        stream_to_sink: bool = False,
        spans: SpanBuffer | None = None,
        captures: Captures | None = None,
        taken: Callable[[int | None, tuple[int, int] | None], None] | None = None,
    ) -> None:
        self.recorder = recorder
        self.backends = backends
        self.sender = sender
        self.captures = captures
        """Profiler captures the sink asks of this process (polled and uploaded here)."""
        self.export_interval = export_interval
        self.stream_to_sink = stream_to_sink and sender is not None
        self._periodic = periodic
        self._on_error = on_error
        self._taken = taken
        """Tracing's work for a flushed step, done here rather than on the training thread: its root
        span, the next steps' ids (``TracingState.taken``)."""
        self._inbox: Inbox[_Message] = Inbox(_INBOX_LIMIT)
        self.bound = StepBound(max_queued_steps)
        buffer = self.span_buffer = spans if spans is not None else SpanBuffer(1)
        self.drops = Drops(resource, buffer, lambda: self.sender.target if self.sender else "the OTLP endpoint")
        self.endpoint = Endpoint(sender, max_queued_steps) if sender is not None else None
        resource_pb = encode_resource(resource.attributes)
        scope = InstrumentationScope(name=attr.INSTRUMENTATION_SCOPE, version=__version__)
        self.spans = SpanOutbox(buffer, self.drops, SpanEncoder(resource_pb, scope))
        self.streams = StreamOutbox(self.drops, resource_pb, scope)
        self.rows = RowOutbox(self.drops, resource_pb, scope)
        self.metrics = MetricOutbox(self.drops, self.bound, MetricEncoder(resource_pb, scope))
        self._outboxes: tuple[Outbox, ...] = (self.spans, self.streams, self.rows, self.metrics)
        """The sink's order: a step's spans and rows are taken before its flush marker."""
        self._relayed: dict[str, Callable[[bytes], None]] = {
            "metrics": self.metrics.relay,
            "spans": self.spans.relay,
            "logs": self.rows.relay,
        }
        self._goodbye_queued = False
        self._drain_until = 0.0
        """How long ``shutdown`` waits for this thread (the drain moves it, with a sink this job owns)."""
        self._waiting: list[threading.Event] = []
        self._handlers: dict[type[_Message], Callable[[Any, _Round], None]] = {
            StepBatch: self._on_step,
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

    @property
    def dropped_total(self) -> int:
        """Points and rows this process lost (``rankscope.dropped_points()``)."""
        return self.drops.total

    # -- caller side -------------------------------------------------------------------

    def submit(self, batch: StepBatch) -> None:
        points = batch.held_points = len(batch.accs)
        if not self.bound.hold(points):
            self.drops.points(
                points, f"{self.bound.max_steps} flushed steps are already waiting (RANKSCOPE_MAX_QUEUED_STEPS)"
            )
            self._refused(batch)
        elif not self._inbox.put(batch):
            self.bound.release(1, points)
            self.drops.points(points, "the export queue is full")
            self._refused(batch)

    def _refused(self, batch: StepBatch) -> None:
        """A step refused at ``submit`` still gets its spans (made here, on the caller's thread): its
        traced blocks' and phases', and its root span, as the user's may have gone to the span buffer already."""
        if batch.phases:
            phases, batch.phases = batch.phases, None
            for span in phase_spans(phases):
                self.span_buffer.add(span)
        if self._taken is not None and batch.root_span is not None:
            self._guarded(self._taken, batch.step, batch.root_span)

    def stream(self, key: str, value: float, reduce: Reduce, when: float, step: int | None) -> None:
        if not self._inbox.put(_Stream(Metric(key, value, reduce, when), step)):
            self.drops.points(1, "the export queue is full")

    def stream_row(self, table: str, row: Row, origin: Provenance, step: int | None) -> None:
        """A recorded sample row, for ``per_rank_no_reduce`` views (every row, not a selection)."""
        if not self._inbox.put(_Row(table, row, origin, step)):
            self.drops.lose_rows(1, "the export queue is full")

    def relay(self, kind: bytes, payload: bytes) -> None:
        """A forked child's serialized request (the fork relay's thread): exported like our own steps."""
        if not self._inbox.put(_Relayed(kind, payload)):
            self.drops.points(1, "the export queue is full")

    def poll(self, done: Callable[[], None]) -> None:
        """Export what the process holds now, even unflushed values (a forked child whose parent
        shuts down), then call ``done`` on the export thread."""
        self._inbox.put(_Poll(done), urgent=True)

    def flush(self, timeout: float) -> bool:
        """Wait until everything queued before this call has been handled (sent, when there is an endpoint)."""
        done = threading.Event()
        self._inbox.put(_Sync(done), urgent=True)
        return done.wait(timeout)

    def shutdown(self, timeout: float) -> None:
        """Send what is held and stop, within ``timeout`` seconds of trying the endpoint; with a sink
        this job owns, also while it starts and, while it is alive, up to ``OWNED_SINK_DRAIN`` (the
        thread moves ``_drain_until``)."""
        stop = _Stop(time.monotonic(), timeout)
        owned = self._owned_sink() is not None
        self._drain_until = stop.asked + (max(timeout, OWNED_SINK_DRAIN) if owned else timeout)
        self._inbox.put(stop, urgent=True)
        while self._thread.is_alive():  # the thread bounds its own attempts by the drain's deadlines
            sink = self._owned_sink()
            if time.monotonic() >= self._drain_until + 1.0 and not (sink is not None and sink.connecting):
                break
            self._thread.join(0.05)
        if self._thread.is_alive():
            # Stuck (a local backend's finish, a send that ignores its deadline): stop the exporter.
            if self.sender is not None:
                self.sender.shutdown(timeout_millis=100)
            self._thread.join(1.0)
            self.drops.points(self.bound.clear(), f"shutdown did not finish exporting within {timeout:.1f}s")
            self.drops.report(final=True)
        elif self.sender is not None:
            self.sender.shutdown()
        self.drops.shutdown()

    def _owned_sink(self) -> EmbeddedSender | None:
        """The sender when it goes to a sink this job owns (embedded, or ``rankscope run``'s)."""
        return self.sender if isinstance(self.sender, EmbeddedSender) else None

    # -- export thread -----------------------------------------------------------------

    def _run(self) -> None:
        try:
            self.backends.init()
        except Exception as exc:
            self._on_error("backend init", exc)
        pending: list[StepBatch] = []  # prepared steps waiting for the next export round
        last_export = 0.0
        stop: _Stop | None = None
        while stop is None:
            wait, idle = self._wait_time(pending, last_export)
            items = self._inbox.take(wait, idle, _MAX_ITEMS_PER_ROUND)
            taken = _Round(pending)
            for item in items:
                self._handlers[type(item)](item, taken)
            stop = taken.stop
            if stop is None:
                pending, last_export = self._end_round(taken, bool(items), last_export)
        self._finish(pending, stop)

    def _held(self) -> bool:
        """Anything encoded or relayed but not sent yet (a failed attempt's, or a child's)."""
        return any(outbox.held() for outbox in self._outboxes)

    def _round_gap(self) -> float:
        """Seconds from one export round to the next: ``_REQUEST_GAP`` per request the last one sent."""
        requests = self.endpoint.requests if self.endpoint is not None else 1
        return min(_MAX_ROUND_GAP, _REQUEST_GAP * max(1, requests))

    def _wait_time(self, pending: list[StepBatch], last_export: float) -> tuple[float, bool]:
        """How long the next round waits for a message, and whether it is idle (a new step wakes it)."""
        now = time.monotonic()
        if self.endpoint is not None and self.endpoint.failures:  # away: wait out the backoff (steps keep queueing)
            return max(0.0, self.endpoint.next_attempt - now), False
        if pending or self._held():
            after_bug = self.endpoint.next_attempt if self.endpoint is not None else 0.0  # set by a round that raised
            return max(0.0, last_export + self._round_gap() - now, after_bug - now), False
        return self.export_interval, True

    def _on_step(self, batch: StepBatch, taken: _Round) -> None:
        self._guarded(self._prepare, batch)
        taken.pending.append(batch)
        if self._taken is not None:
            self._guarded(self._taken, batch.step, batch.root_span)

    def _on_stream(self, item: _Stream, taken: _Round) -> None:
        if self.stream_to_sink:
            self.streams.add(item.metric, item.step)
        else:
            self._guarded(self.backends.log_stream, item.metric, item.step)

    def _on_row(self, item: _Row, taken: _Round) -> None:
        if self.stream_to_sink:
            self.rows.stream(item.table, item.row, item.origin, item.step)
        else:
            self._guarded(self.backends.log_row, item.table, item.row, item.origin, item.step)

    def _on_poll(self, item: _Poll, taken: _Round) -> None:
        taken.polls.append(item.done)
        taken.synced = True
        if self._periodic():  # the parent is shutting down: what this child holds, now
            self._hold_and_prepare(self.recorder.take(None), taken.pending)

    def _on_relayed(self, item: _Relayed, taken: _Round) -> None:
        relay = self._relayed.get(SIGNALS.get(item.kind, "metrics"))
        if relay is not None:
            self._guarded(relay, item.payload)

    def _on_sync(self, item: _Sync, taken: _Round) -> None:
        self._waiting.append(item.done)
        taken.synced = True

    def _on_stop(self, item: _Stop, taken: _Round) -> None:
        taken.stop = item

    def _hold_and_prepare(self, batch: StepBatch | None, pending: list[StepBatch]) -> None:
        """A step taken on this thread (a periodic export) joins the bound and, if it fits, the pending steps."""
        if batch is None:
            return
        batch.held_points = len(batch.accs)
        if self.bound.hold(batch.held_points):
            self._guarded(self._prepare, batch)
            pending.append(batch)
        else:
            self.drops.points(batch.held_points, "the export queue is full")
            if batch.phases:  # its traced blocks' spans are made from its phases: kept, as at ``submit``
                phases, batch.phases = batch.phases, None
                for span in phase_spans(phases):
                    self.span_buffer.add(span)

    def _end_round(self, taken: _Round, took_items: bool, last_export: float) -> tuple[list[StepBatch], float]:
        """After a round's messages: service captures, take a periodic step, send when due, answer
        flushes and polls. Returns the pending steps and the last export's time, both new after a send."""
        if self.captures is not None:
            self._guarded(self.captures.service)
        endpoint = self.endpoint
        now = time.monotonic()
        pending = taken.pending
        if not took_items and not pending and not (endpoint is not None and endpoint.failures) and self._periodic():
            # A process that never flushes. While the endpoint is down its values keep
            # accumulating in place (constant memory) instead of filling the queue. The
            # caller's thread takes the step when asked (``Recorder.take_periodic``); an
            # idle caller's step is taken here one interval after the ask.
            self._hold_and_prepare(self.recorder.take_periodic(grace=self.export_interval), pending)
        work = pending or self._held() or any(outbox.fresh() for outbox in self._outboxes)
        ready = endpoint is None or endpoint.ready(now) or taken.synced  # a force_flush tries at once
        if work and ready and (taken.synced or now - last_export >= self._round_gap()):
            self._try_round(pending, None, False)
            pending, last_export = [], time.monotonic()
        if not pending and not self._held():
            self._release_waiting()
        for done in taken.polls:
            self._guarded(done)
        return pending, last_export

    def _finish(self, pending: list[StepBatch], stop: _Stop) -> None:
        """Stop: keep trying (with the same backoff) until the shutdown deadline, then count what is left.

        With a sink this job owns, the drain counts from when the sink was ready (its starter waits
        for it to start: that is not time spent on the endpoint), and what it did not take in time
        (a busy box: DEADLINE_EXCEEDED) is retried past the deadline while the sink is alive, up to
        ``OWNED_SINK_DRAIN``: only a sink that is gone, or still busy after that, loses it."""
        sink = self._owned_sink()
        extended = False
        while True:
            deadline, longest = self._drain_deadlines(stop, sink)
            self._try_round(pending, longest if extended else deadline, True)
            pending = []
            if not self._held() or self.endpoint is None:
                break
            deadline, longest = self._drain_deadlines(stop, sink)  # the round may have started the sink
            wait = max(0.0, self.endpoint.next_attempt - time.monotonic())
            after = time.monotonic() + wait
            if after >= (longest if extended else deadline) - 0.05:
                if extended or sink is None or after >= longest - 0.05 or not sink.alive():
                    break
                extended = True  # alive but slow: retried, its attempts may take until the drain's end
            time.sleep(wait)
        if self._held():
            for outbox in self._outboxes:
                outbox.abandon("shutdown ended before the endpoint answered")
            self.drops.report(final=True)
        self._release_waiting()
        self._guarded(self.backends.finish)

    def _drain_deadlines(self, stop: _Stop, sink: EmbeddedSender | None) -> tuple[float, float]:
        """(the drain's deadline, the longest it may go on while a sink this job owns is alive), and
        tells ``shutdown`` how long to wait for this thread."""
        if sink is None:
            return stop.deadline, stop.deadline
        begun = max(stop.asked, sink.ready_at or 0.0)
        deadline, longest = begun + stop.timeout, begun + max(stop.timeout, OWNED_SINK_DRAIN)
        self._drain_until = max(self._drain_until, longest)
        return deadline, longest

    def _try_round(self, pending: list[StepBatch], deadline: float | None, goodbye: bool) -> None:
        if self.endpoint is not None:
            self.endpoint.start_round()
        try:
            self._round(pending, deadline, goodbye)
        except Exception as exc:
            if self.endpoint is not None:
                self.endpoint.after_bug()
            self._on_error("export", exc)

    def _round(self, batches: list[StepBatch], deadline: float | None, goodbye: bool) -> None:
        """One export round: encode the new steps behind the held ones, then let each outbox send,
        in order, until one fails (then back off) or all are out."""
        endpoint = self.endpoint
        if endpoint is None:  # local backends only: nothing leaves the process
            self.bound.release(len(batches), sum(b.held_points for b in batches))
            self._recycle(batches)
            return
        try:
            self._encode(batches, goodbye)
        except Exception:
            self.bound.release(len(batches), sum(b.held_points for b in batches))
            self.drops.points(sum(len(b.accs) for b in batches), "a step could not be encoded")
            rows = sum(len(t.distinct()) for b in batches for t in b.samples or ())
            self.drops.lose_rows(rows, "a step could not be encoded")
            raise
        self._recycle(batches)
        for outbox in self._outboxes:
            failed = outbox.send(endpoint, deadline)
            if failed is not None:
                endpoint.failed(failed)
                return
        endpoint.recovered()
        self.drops.report(final=False)

    def _encode(self, batches: list[StepBatch], goodbye: bool) -> None:
        # A forked child (relayed) is never waited for by a sink: no goodbye to say.
        goodbye = goodbye and not self._goodbye_queued and not isinstance(self.sender, RelaySender)
        if not batches and not goodbye:
            return
        self.metrics.add_steps(batches, goodbye, pause=_Pause())
        for batch in batches:
            if batch.samples:
                self.rows.select(batch)
        self._goodbye_queued = self._goodbye_queued or goodbye

    def _recycle(self, batches: list[StepBatch]) -> None:
        """The steps' accumulators, encoded and seen by the local views, serve later steps' first
        values (``Recorder.recycle``); the batches are not read again."""
        for batch in batches:  # the newest last: the next take pops it first (its keys are the likeliest)
            self.recorder.recycle(batch.accs)
            batch.accs = {}

    def _prepare(self, batch: StepBatch) -> None:
        """Read device values and GPU-timed durations, make the CPU-timed phases' durations and spans,
        then give the step to the local backends."""
        if batch.deferred:
            self.recorder.resolve_deferred(batch)
        if batch.phases:
            self.recorder.resolve_phases(batch)
            for span in phase_spans(batch.phases):  # sampled: the spans, before the step's marker leaves
                self.span_buffer.add(span)
            batch.phases = None
        if batch.device is not None:
            self.recorder.stream_device_values(batch, batch.device.values())
            batch.device = None
        self.backends.log_batch(batch)
        if batch.samples:
            self.backends.log_samples(batch)

    def _release_waiting(self) -> None:
        for done in self._waiting:
            done.set()
        self._waiting = []

    def _guarded(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:
            self._on_error(getattr(fn, "__name__", "export"), exc)
