"""The export thread's messages, and what it does with each one it takes from its inbox.

The training thread's calls (``ExportThread.submit``, ``stream``, ...) only put a message in the
inbox; everything a message asks for is done here, on the export thread: a flushed step is
prepared (device values read, its phases' spans made, the local views fed), a streamed value or
row goes to its outbox or the local views, a forked child's request to its outbox, and a flush, a
poll or the stop is noted for the end of the loop's turn. Kept apart from the thread so its loop
reads as scheduling only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..backends.base import Metric
from ..metrics.recorder import HandedStep, Recorder, StepBatch, as_batch
from ..metrics.samples import Provenance, Row
from ..tracing.spans import SpanBuffer
from ..tracing.tracer import phase_spans
from .drops import Drops
from .local_views import BackendSet
from .outboxes import MetricOutbox, RowOutbox, SpanOutbox, StepBound, StreamOutbox
from .senders import SIGNALS


@dataclass(slots=True)
class StreamedValue:
    metric: Metric
    step: int | None


@dataclass(slots=True)
class StreamedRow:
    table: str
    row: Row
    origin: Provenance
    step: int | None


@dataclass(slots=True)
class Relayed:
    kind: bytes
    payload: bytes


@dataclass(slots=True)
class Poll:
    done: Callable[[], None]


@dataclass(slots=True)
class Sync:
    done: threading.Event


@dataclass(slots=True)
class Stop:
    asked: float
    """When shutdown asked (``time.monotonic``)."""
    timeout: float
    """``RANKSCOPE_SHUTDOWN_TIMEOUT``: how long the drain tries the endpoint."""


Message = HandedStep | StepBatch | StreamedValue | StreamedRow | Relayed | Poll | Sync | Stop
"""A flushed step is its own message: a plain tuple for a step of host values and phases, made a
``StepBatch`` here (no object to build on the caller's thread), else its batch."""


@dataclass(slots=True)
class Taken:
    """What the messages of one turn of the export thread's loop asked for."""

    pending: list[StepBatch]
    """Prepared steps waiting for the next export round (the loop's list, carried across turns)."""
    synced: bool = False
    """A force_flush or a poll: try to send at once."""
    polls: list[Callable[[], None]] = field(default_factory=list)
    """Polls' callbacks, called at the end of the turn."""
    stop: Stop | None = None
    """Set by a stop: the shutdown's drain follows."""


class Dispatcher:
    """The export thread's handler of each kind of message (``handlers``), and the flushes waiting on it."""

    def __init__(
        self,
        *,
        recorder: Recorder,
        backends: BackendSet,
        span_buffer: SpanBuffer,
        spans: SpanOutbox,
        streams: StreamOutbox,
        rows: RowOutbox,
        metrics: MetricOutbox,
        bound: StepBound,
        drops: Drops,
        stream_to_sink: bool,
        periodic: Callable[[], bool],
        taken: Callable[[int | None, tuple[int, int] | None], None] | None,
        guarded: Callable[..., None],
    ) -> None:
        self._recorder = recorder
        self._backends = backends
        self._span_buffer = span_buffer
        self._streams = streams
        self._rows = rows
        self._bound = bound
        self._drops = drops
        self._stream_to_sink = stream_to_sink
        self._periodic = periodic
        self._taken = taken
        """Tracing's work for a flushed step (``ExportThread``'s ``taken``)."""
        self._guarded = guarded
        """Calls a function and reports what it raises (``ExportThread._guarded``)."""
        self._relayed: dict[str, Callable[[bytes], None]] = {
            "metrics": metrics.relay,
            "spans": spans.relay,
            "logs": rows.relay,
        }
        self._waiting: list[threading.Event] = []
        self.handlers: dict[type[Message], Callable[[Any, Taken], None]] = {  # a handed step: ``take_in`` first
            StepBatch: self._on_step,
            StreamedValue: self._on_stream,
            StreamedRow: self._on_row,
            Poll: self._on_poll,
            Relayed: self._on_relayed,
            Sync: self._on_sync,
            Stop: self._on_stop,
        }
        """The handler of each kind of message, called with it and the loop's ``Taken``."""

    def take_in(self, items: list[Message]) -> None:
        """The handed-over steps among ``items`` (taken from the inbox) become their batches, held
        in the bound, before any message is handled: a shutdown that finds this thread stuck on one
        of them counts every other's points too (``ExportThread.shutdown``)."""
        for i, item in enumerate(items):
            if type(item) is tuple:
                batch = as_batch(item)
                batch.held_points = len(batch.accs)  # with the recycled ones no value reached: see ``_prepare``
                self._bound.hold_received(batch.held_points)
                items[i] = batch

    def release_waiting(self) -> None:
        """Answer the flushes waiting since their messages were handled (nothing is pending or held now)."""
        for done in self._waiting:
            done.set()
        self._waiting = []

    def hold_and_prepare(self, batch: StepBatch | None, pending: list[StepBatch]) -> None:
        """A step taken on this thread (a periodic export) joins the bound and, if it fits, the pending steps."""
        if batch is None:
            return
        self._recorder.drop_unrecorded(batch)
        batch.held_points = len(batch.accs)
        if self._bound.hold(batch.held_points):
            self._guarded(self._prepare, batch)
            pending.append(batch)
        else:
            self._drops.points(batch.held_points, "the export queue is full")
            if batch.phases:  # its traced blocks' spans are made from its phases: kept, as at ``submit``
                phases, batch.phases = batch.phases, None
                for span in phase_spans(phases):
                    self._span_buffer.add(span)

    def _on_step(self, batch: StepBatch, taken: Taken) -> None:
        self._guarded(self._prepare, batch)
        taken.pending.append(batch)
        if self._taken is not None:
            self._guarded(self._taken, batch.step, batch.root_span)

    def _on_stream(self, item: StreamedValue, taken: Taken) -> None:
        if self._stream_to_sink:
            self._streams.add(item.metric, item.step)
        else:
            self._guarded(self._backends.log_stream, item.metric, item.step)

    def _on_row(self, item: StreamedRow, taken: Taken) -> None:
        if self._stream_to_sink:
            self._rows.stream(item.table, item.row, item.origin, item.step)
        else:
            self._guarded(self._backends.log_row, item.table, item.row, item.origin, item.step)

    def _on_poll(self, item: Poll, taken: Taken) -> None:
        taken.polls.append(item.done)
        taken.synced = True
        if self._periodic():  # the parent is shutting down: what this child holds, now
            self.hold_and_prepare(self._recorder.take(None), taken.pending)

    def _on_relayed(self, item: Relayed, taken: Taken) -> None:
        relay = self._relayed.get(SIGNALS.get(item.kind, "metrics"))
        if relay is not None:
            self._guarded(relay, item.payload)

    def _on_sync(self, item: Sync, taken: Taken) -> None:
        self._waiting.append(item.done)
        taken.synced = True

    def _on_stop(self, item: Stop, taken: Taken) -> None:
        taken.stop = item

    def _drop_unrecorded(self, batch: StepBatch) -> None:
        """The recycled accumulators the step started with and never used leave it, and the bound."""
        dropped = self._recorder.drop_unrecorded(batch)
        if dropped and batch.held_points:
            released = min(dropped, batch.held_points)
            batch.held_points -= released
            self._bound.release(0, released)

    def _prepare(self, batch: StepBatch) -> None:
        """Read device values and GPU-timed durations, make the CPU-timed phases' durations and spans,
        then give the step to the local backends."""
        try:
            if batch.deferred:
                self._recorder.resolve_deferred(batch)
            if batch.phases:
                self._recorder.resolve_phases(batch)
                for span in phase_spans(batch.phases):  # sampled: the spans, before the step's marker leaves
                    self._span_buffer.add(span)
                batch.phases = None
            if batch.device is not None:
                self._recorder.stream_device_values(batch, batch.device.values())
                batch.device = None
        finally:  # whatever raised above, the step goes out without them (its marker counts its points)
            self._drop_unrecorded(batch)
        self._backends.log_batch(batch)
        if batch.samples:
            self._backends.log_samples(batch)
