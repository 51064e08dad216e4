"""GPU timing as an OpenTelemetry ``SpanProcessor``: CUDA events in, GPU-clocked spans out.

On the caller's thread a span's boundaries only *record* pooled CUDA events on the
current stream (a few µs, never a synchronize). A poller thread ``query()``s them; once
a span's end event has completed, its start/end times are replaced by GPU times and the
span goes to the next processor, with the CPU times kept as attributes.

GPU times become host times through an anchor: the poller records an event on an idle
side stream, waits for it, and pairs it with the host clock. ``elapsed_time`` is float32
milliseconds, so the anchor is renewed every ``reanchor_s`` seconds to keep µs precision
and follow clock drift. During CUDA-graph capture nothing is recorded (an event would
become a graph node): those spans keep CPU times.

``device`` is ``torch.cuda`` or anything with the same interface (``Event``, ``Stream``,
``is_current_stream_capturing``, ``current_device``); tests drive the logic on CPU through it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

from opentelemetry.sdk.trace import SpanProcessor

from ..core import names as attr
from .spans import SpanRecord, from_readable, now_ns

_ANCHOR_TRIES = 5
_TIGHT_ANCHOR_NS = 200_000
"""An anchor bracketed within 0.2 ms is kept at once; else the tightest of a few tries."""


class Mark:
    """One recorded CUDA event, shared by the spans that start or end at it."""

    __slots__ = ("device", "event", "host_ns", "refs")

    def __init__(self, event: Any, device: int, host_ns: int) -> None:
        self.event, self.device, self.host_ns, self.refs = event, device, host_ns, 0


class CudaTimingProcessor(SpanProcessor):
    """Holds spans until their CUDA events complete, then passes them on with GPU times."""

    def __init__(
        self,
        next_processor: SpanProcessor,
        device: Any = None,
        *,
        reanchor_s: float = 10.0,
        poll_s: float = 0.002,
        max_pending: int = 65536,
        on_error: Any = None,
    ) -> None:
        if device is None:
            import torch

            device = torch.cuda
        self.next = next_processor
        self.device = device
        self.reanchor_s = reanchor_s
        self.poll_s = poll_s
        self.max_pending = max_pending
        self.dropped = 0
        self._on_error = on_error
        self._pool: list[Any] = []
        self._pool_lock = threading.Lock()
        self._open: dict[int, Mark | None] = {}
        self._pending: deque[tuple[Any, Mark, Mark]] = deque()
        self._anchors: dict[int, tuple[Any, int, float]] = {}  # device -> (event, host ns, monotonic when made)
        self._side_streams: dict[int, Any] = {}
        self._wake = threading.Condition()
        self._stopped = False
        self.anchors_made = 0
        self._thread = threading.Thread(target=self._poll, name="rankscope-cuda-timing", daemon=True)
        self._thread.start()

    # -- caller's thread: record only -----------------------------------------------------

    def mark(self) -> Mark | None:
        """Record one pooled event on the current stream; None while a CUDA graph is captured."""
        if self.device.is_current_stream_capturing():
            return None
        with self._pool_lock:
            event = self._pool.pop() if self._pool else None
        if event is None:
            event = self.device.Event(enable_timing=True)
        event.record()
        return Mark(event, self.device.current_device(), now_ns())

    def submit(self, span: Any, start: Mark | None, end: Mark | None) -> None:
        """Queue a finished span whose boundaries are ``start``/``end``; without both it keeps CPU times."""
        if start is None or end is None or start.device != end.device:
            self.next.on_end(span)
            return
        if len(self._pending) >= self.max_pending:
            self.dropped += 1
            return
        if not isinstance(span, SpanRecord):  # an SDK span: its times are read-only
            span = from_readable(span)
        with self._pool_lock:
            start.refs += 1
            end.refs += 1
        self._pending.append((span, start, end))

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self._open[_span_id(span)] = self.mark()

    def on_end(self, span: Any) -> None:
        start = self._open.pop(_span_id(span), None)
        self.submit(span, start, self.mark() if start is not None else None)

    # -- poller thread ---------------------------------------------------------------------

    def _poll(self) -> None:
        while True:
            with self._wake:
                if not self._pending and not self._stopped:
                    self._wake.wait(self.poll_s * 10)
                stopped = self._stopped
            try:
                self._renew_anchors()
                progressed = self._complete_ready()
            except Exception as exc:  # a bug here must not leave spans pending forever
                progressed = False
                if self._on_error is not None:
                    self._on_error("CUDA span timing", exc)
                self._pending.clear()
            if stopped and not self._pending:
                return
            if not progressed:
                time.sleep(self.poll_s)

    def _complete_ready(self) -> bool:
        """Finish every span at the head of the queue whose end event has completed."""
        progressed = False
        while self._pending:
            span, start, end = self._pending[0]
            if not end.event.query():
                break
            self._pending.popleft()
            self._finish(span, start, end)
            progressed = True
        with self._wake:
            self._wake.notify_all()
        return progressed

    def _finish(self, span: Any, start: Mark, end: Mark) -> None:
        anchor, anchor_ns = self._anchor(start.device)
        attributes = span.attributes if span.attributes is not None else {}
        attributes[attr.CPU_START] = span.start_time
        attributes[attr.CPU_END] = span.end_time
        attributes[attr.TIMER] = "gpu"
        span.attributes = attributes
        span.start_time = anchor_ns + round(anchor.elapsed_time(start.event) * 1e6)
        span.end_time = max(span.start_time, anchor_ns + round(anchor.elapsed_time(end.event) * 1e6))
        self._release(start)
        self._release(end)
        self.next.on_end(span)

    def _anchor(self, device: int) -> tuple[Any, int]:
        found = self._anchors.get(device)
        if found is None:
            found = self._new_anchor(device)
        return found[0], found[1]

    def _renew_anchors(self) -> None:
        """Keep anchors young: float32 ms stays µs-precise, and the host clock's drift is followed."""
        now = time.monotonic()
        for device, (_, _, made) in list(self._anchors.items()):
            if now - made >= self.reanchor_s:
                self._new_anchor(device)

    def _new_anchor(self, device: int) -> tuple[Any, int, float]:
        stream = self._side_streams.get(device)
        if stream is None:
            stream = self._side_streams[device] = self.device.Stream(device=device)
        best: tuple[int, Any, int] | None = None  # (bracket width, event, host ns)
        for _ in range(_ANCHOR_TRIES):  # keep the tightest bracket: a preempted poller gives a loose one
            event = self.device.Event(enable_timing=True)
            before = now_ns()
            event.record(stream)
            event.synchronize()  # an idle stream: completes at once, on this thread only
            after = now_ns()
            if best is None or after - before < best[0]:
                best = (after - before, event, (before + after) // 2)
            if after - before <= _TIGHT_ANCHOR_NS:
                break
        assert best is not None
        found = self._anchors[device] = (best[1], best[2], time.monotonic())
        self.anchors_made += 1
        return found

    def hold(self, *marks: Mark) -> None:
        """Keep events out of the pool until ``release`` (a duration metric reads them later)."""
        with self._pool_lock:
            for mark in marks:
                mark.refs += 1

    def release(self, *marks: Mark) -> None:
        for mark in marks:
            self._release(mark)

    @staticmethod
    def elapsed_s(start: Mark, end: Mark) -> float:
        """Seconds between two marks, waiting for the end event (only ever on a background thread)."""
        end.event.synchronize()
        return float(start.event.elapsed_time(end.event)) / 1e3

    def _release(self, mark: Mark) -> None:
        with self._pool_lock:
            mark.refs -= 1
            if mark.refs <= 0:
                self._pool.append(mark.event)

    # -- SpanProcessor lifecycle -----------------------------------------------------------

    @property
    def pending(self) -> int:
        return len(self._pending)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Wait (on the calling thread) until every queued span has been passed on."""
        deadline = time.monotonic() + timeout_millis / 1000
        with self._wake:
            while self._pending and self._thread.is_alive():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wake.wait(min(left, self.poll_s * 10))
        return not self._pending

    def shutdown(self) -> None:
        self.force_flush(timeout_millis=5000)
        with self._wake:
            self._stopped = True
            self._wake.notify_all()
        self._thread.join(5.0)


def _span_id(span: Any) -> int:
    found = getattr(span, "span_id", None)
    return int(found) if found is not None else int(span.context.span_id)
