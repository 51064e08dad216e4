"""The export thread: it schedules; the parts do the work.

``flush`` puts a ``StepBatch`` in the ``inbox`` and returns (O(1): a lock, a counter, an append;
no wake-up while steps come faster than the export cadence). This thread handles each message
(``messages``: it reads device values, waiting on CUDA events here, never on the caller, and
hands reduced values to the local backends) and runs export rounds (``rounds``): the new steps
are encoded (``encode``, bytes from per-key templates), then each outbox (``outboxes``: spans,
streamed values, sample rows, metrics, in the sink's order) sends what it holds through the
``Endpoint`` (a ``Sender`` and one backoff). Rounds are spaced 0.3 s per request they sent, up to
0.6 s (~3 requests a second per process in a training loop, which sends metrics and spans): steps
flushed faster share a request, and a slower step leaves at its flush.

Why it retries itself: the OTel SDK exporters retry with exponential backoff *inside*
``export()`` and then drop the batch, so an endpoint outage used to lose every step while this
thread slept in the SDK's backoff. Here each send is one attempt with one deadline (``senders``);
what could not be sent stays in its outbox, in order, and the next round comes after the
endpoint's backoff, then sends the backlog oldest first. The bound is in steps: at most
``max_queued_steps`` flushed steps (default 300, five minutes at one step per second) are held,
queued or unsent (``StepBound``); a flush beyond that is dropped and counted, so only what
overflows is lost. Everything lost is counted in one place (``drops``) and reported as a warning
and in the ``rankscope.dropped_points`` metric once an export goes through again; shutdown keeps
trying until ``RANKSCOPE_SHUTDOWN_TIMEOUT`` and counts what is left (the drain, ``rounds``).

Forked children (DataLoader workers) export through their parent: their serialized requests
arrive from ``senders.ForkRelay`` and join the outbox of their signal (``relay``); a child's
thread exports on its parent's request at the parent's shutdown (``poll``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.sdk.resources import Resource

from .._version import __version__
from ..backends.base import Metric
from ..core import names as attr
from ..core.identity import speaker
from ..metrics.recorder import HandedStep, Recorder, StepBatch, as_batch
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
from .messages import Dispatcher, Message, Poll, Relayed, Stop, StreamedRow, StreamedValue, Sync, Taken
from .outboxes import MetricOutbox, Outbox, RowOutbox, SpanOutbox, StepBound, StreamOutbox
from .rounds import Rounds
from .senders import EmbeddedSender, Sender

_INBOX_LIMIT = 65536
_MAX_ITEMS_PER_ROUND = 256
_REQUEST_GAP = 0.3
"""Seconds per OTLP request between export rounds (up to ``_MAX_ROUND_GAP``): a round that sent
metrics and spans waits 0.6 s. Steps flushed faster than this share a request (a 20 ms training step
would otherwise pay a gRPC call per step and signal); a slower step leaves at its flush (``Inbox``).
A gRPC call costs the export thread and gRPC's own threads ~1 ms of CPU after a pause: at 0.2 s a
request the whole process read 1.22 × [1.10, 1.28] what it reads at 0.3 s a 20 ms step, the
training thread's calls 1.08 × [0.94, 1.17] (``bench_peers.py``, 9 rounds, the 2-core VM,
2026-12-02; docs/benchmarks.md). A longer cadence (0.5 s, at most 1 s) once cost the training
thread +33 µs a step (2026-11-27)."""
_MAX_ROUND_GAP = 0.6
"""The longest wait between rounds, however many requests the last one sent: a step reaches the
endpoint within about this long of its flush (streams, rows, spans and metrics in one round would
ask 1.2 s)."""
MAX_START_WAIT = 90.0
"""How long a shutdown waits, at most, for the job's own sink to be found or started (its start is
bounded at 60 s, the lock before it only by the process holding it)."""


class ExportThread:
    """The inbox, the outboxes and the thread that moves steps from one to the others: the caller
    side, and the loop's schedule; what a message asks for is the ``Dispatcher``'s, what leaves the
    process and the shutdown's drain are the ``Rounds``'."""

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
        connect_at_start: bool = False,
    ) -> None:
        self.recorder = recorder
        self._connect_at_start = connect_at_start
        """Find or start a sink this job owns as the thread starts, not at its first send: an
        explicit ``init`` (an automatic one may yet be renamed by the program's own ``init``)."""
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
        self._inbox: Inbox[Message] = Inbox(_INBOX_LIMIT)
        self.bound = StepBound(max_queued_steps)
        buffer = self.span_buffer = spans if spans is not None else SpanBuffer(1)
        who, first = speaker(resource.attributes)
        self.drops = Drops(resource, buffer, lambda: self.sender.target if self.sender else "the OTLP endpoint", who)
        self.endpoint = (
            Endpoint(sender, max_queued_steps, who, says_down=first, rejected=self.drops.rejected)
            if sender is not None
            else None
        )
        resource_pb = encode_resource(resource.attributes)
        scope = InstrumentationScope(name=attr.INSTRUMENTATION_SCOPE, version=__version__)
        self.spans = SpanOutbox(buffer, self.drops, SpanEncoder(resource_pb, scope))
        self.streams = StreamOutbox(self.drops, resource_pb, scope)
        self.rows = RowOutbox(self.drops, resource_pb, scope)
        self.metrics = MetricOutbox(self.drops, self.bound, MetricEncoder(resource_pb, scope))
        self._outboxes: tuple[Outbox, ...] = (self.spans, self.streams, self.rows, self.metrics)
        """The sink's order: a step's spans and rows are taken before its flush marker."""
        self._messages = Dispatcher(
            recorder=recorder,
            backends=backends,
            span_buffer=buffer,
            spans=self.spans,
            streams=self.streams,
            rows=self.rows,
            metrics=self.metrics,
            bound=self.bound,
            drops=self.drops,
            stream_to_sink=self.stream_to_sink,
            periodic=periodic,
            taken=taken,
            guarded=self._guarded,
        )
        """What each message taken from the inbox asks of the export thread."""
        self._rounds = Rounds(
            recorder=recorder,
            sender=sender,
            endpoint=self.endpoint,
            bound=self.bound,
            drops=self.drops,
            outboxes=self._outboxes,
            metrics=self.metrics,
            rows=self.rows,
            on_error=on_error,
        )
        """The export rounds this thread schedules, and the shutdown's drain."""
        self._thread = threading.Thread(target=self._run, name="rankscope-export", daemon=True)
        self._thread.start()

    @property
    def dropped_total(self) -> int:
        """Points and rows this process lost (``rankscope.dropped_points()``)."""
        return self.drops.total

    # -- caller side -------------------------------------------------------------------

    def submit(self, batch: StepBatch) -> None:
        points = batch.held_points = len(batch.accs)  # with the recycled ones no value reached: see ``_prepare``
        if not self.bound.hold(points):
            self._refused(batch, self._full())
        elif not self._inbox.put(batch):
            self.bound.release(1, points)
            self._refused(batch, "the export queue is full")

    def hand_off(self, handed: HandedStep) -> None:
        """A plain step (``Recorder.hand_off``): into the inbox as it is, without the bound's lock;
        the export thread makes its batch and holds it (``Dispatcher``). Refused like ``submit``'s."""
        bound = self.bound
        if not bound.has_room():
            self._refused(as_batch(handed), self._full())
            return
        bound.hand()  # before the put: the export thread never takes in more than were handed
        if not self._inbox.put(handed):
            bound.hand_back()
            self._refused(as_batch(handed), "the export queue is full")

    def _full(self) -> str:
        return f"{self.bound.max_steps} flushed steps are already waiting (RANKSCOPE_MAX_QUEUED_STEPS)"

    def _refused(self, batch: StepBatch, why: str) -> None:
        """A step refused at ``submit``: its points are counted lost, and it still gets its spans (made
        here, on the caller's thread): its traced blocks' and phases', and its root span, as the
        user's may have gone to the span buffer already."""
        self.drops.points(len(batch.accs) - self.recorder.drop_unrecorded(batch), why)
        if batch.phases:
            phases, batch.phases = batch.phases, None
            for span in phase_spans(phases):
                self.span_buffer.add(span)
        if self._taken is not None and batch.root_span is not None:
            self._guarded(self._taken, batch.step, batch.root_span)

    def stream(self, key: str, value: float, reduce: Reduce, when: float, step: int | None) -> None:
        if not self._inbox.put(StreamedValue(Metric(key, value, reduce, when), step)):
            self.drops.points(1, "the export queue is full")

    def stream_row(self, table: str, row: Row, origin: Provenance, step: int | None) -> None:
        """A recorded sample row, for ``per_rank_no_reduce`` views (every row, not a selection)."""
        if not self._inbox.put(StreamedRow(table, row, origin, step)):
            self.drops.lose_rows(1, "the export queue is full")

    def relay(self, kind: bytes, payload: bytes) -> None:
        """A forked child's serialized request (the fork relay's thread): exported like our own steps."""
        if not self._inbox.put(Relayed(kind, payload)):
            self.drops.points(1, "the export queue is full")

    def poll(self, done: Callable[[], None]) -> None:
        """Export what the process holds now, even unflushed values (a forked child whose parent
        shuts down), then call ``done`` on the export thread."""
        self._inbox.put(Poll(done), urgent=True)

    def flush(self, timeout: float) -> bool:
        """Wait until everything queued before this call has been handled (sent, when there is an endpoint)."""
        done = threading.Event()
        self._inbox.put(Sync(done), urgent=True)
        return done.wait(timeout)

    def shutdown(self, timeout: float, exit_error: str | None = None, exit_step: int | None = None) -> None:
        """Send what is held and stop, within ``timeout`` seconds of trying the endpoint; with a sink
        this job owns, also while it starts and, while it is alive, up to ``OWNED_SINK_DRAIN`` (the
        drain moves ``Rounds.drain_until``). ``exit_error``: the exception that ended the process,
        said with its goodbye, and the step it was in (``exit_step``)."""
        self.metrics.exit_error, self.metrics.exit_step = exit_error, exit_step
        stop = Stop(time.monotonic(), timeout)
        rounds = self._rounds
        rounds.expect_drain(stop.asked, timeout)
        self._inbox.put(stop, urgent=True)
        while self._thread.is_alive():  # the thread bounds its own attempts by the drain's deadlines
            sink = self._owned_sink()
            now = time.monotonic()
            starting = sink is not None and sink.connecting and now < stop.asked + MAX_START_WAIT
            if now >= rounds.drain_until + 1.0 and not starting:
                break
            self._thread.join(0.05)
        if self._thread.is_alive():
            # Stuck (a local backend's finish, a send that ignores its deadline): stop the exporter.
            if self.sender is not None:
                self.sender.shutdown(timeout_millis=100)
            self._thread.join(1.0)
            waiting = self._inbox.snapshot()
            handed = [as_batch(m) for m in waiting if type(m) is tuple]  # not in the bound yet
            queued = handed + [m for m in waiting if type(m) is StepBatch]
            handed_points = sum(len(b.accs) for b in handed)  # before the unused ones leave them
            unused = sum(self.recorder.drop_unrecorded(m) for m in queued)
            lost = max(0, self.bound.clear() + handed_points - unused)  # the steps still queued were never prepared
            self.drops.points(lost, f"shutdown did not finish exporting within {timeout:.1f}s")
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
        sink = self._owned_sink()
        if sink is not None and self._connect_at_start:  # the sink starts while the job sets up
            self._guarded(sink.connect)
        handlers = self._messages.handlers
        pending: list[StepBatch] = []  # prepared steps waiting for the next export round
        last_export = 0.0
        stop: Stop | None = None
        while stop is None:
            wait, idle = self._wait_time(pending, last_export)
            items = self._inbox.take(wait, idle, _MAX_ITEMS_PER_ROUND)
            self._messages.take_in(items)
            taken = Taken(pending)
            for item in items:
                handlers[type(item)](item, taken)
            stop = taken.stop
            if stop is None:
                pending, last_export = self._end_round(taken, bool(items), last_export)
        self._rounds.drain(pending, stop.asked, stop.timeout)
        self._messages.release_waiting()
        self._guarded(self.backends.finish)

    def _round_gap(self) -> float:
        """Seconds from one export round's start to the next's: ``_REQUEST_GAP`` per request the last one
        sent. Counted from the start, a round that took long (a slow answer, a stall of the box) leaves
        the steps flushed meanwhile to go as soon as it ends, instead of waiting a whole gap more; from
        its end, a 1 s stall once made the next steps of a job at 0.7 s a step arrive 0.5-0.9 s after
        their flush, three in a row (each waited a gap behind the one before)."""
        requests = self.endpoint.requests if self.endpoint is not None else 1
        return min(_MAX_ROUND_GAP, _REQUEST_GAP * max(1, requests))

    def _wait_time(self, pending: list[StepBatch], last_export: float) -> tuple[float, bool]:
        """How long the next round waits for a message, and whether it is idle (a new step wakes it)."""
        now = time.monotonic()
        if self.endpoint is not None and self.endpoint.failures:  # away: wait out the backoff (steps keep queueing)
            return max(0.0, self.endpoint.next_attempt - now), False
        if pending or self._rounds.held():
            after_bug = self.endpoint.next_attempt if self.endpoint is not None else 0.0  # set by a round that raised
            return max(0.0, last_export + self._round_gap() - now, after_bug - now), False
        return self.export_interval, True

    def _end_round(self, taken: Taken, took_items: bool, last_export: float) -> tuple[list[StepBatch], float]:
        """After a round's messages: service captures, take a periodic step, send when due, answer
        flushes and polls. Returns the pending steps and the last export's start, both new after a send."""
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
            self._messages.hold_and_prepare(self.recorder.take_periodic(grace=self.export_interval), pending)
        work = pending or self._rounds.held() or any(outbox.fresh() for outbox in self._outboxes)
        ready = endpoint is None or endpoint.ready(now) or taken.synced  # a force_flush tries at once
        if work and ready and (taken.synced or now - last_export >= self._round_gap()):
            self._rounds.run(pending, None, False)
            pending, last_export = [], now  # its start: a round slowed by a stall never delays the next
        if not pending and not self._rounds.held():
            self._messages.release_waiting()
        for done in taken.polls:
            self._guarded(done)
        return pending, last_export

    def _guarded(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:
            self._on_error(getattr(fn, "__name__", "export"), exc)
