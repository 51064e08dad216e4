"""Spans as rankscope records them: slotted records, one trace per step (encoded by ``otlp.spans``).

``trace(...).step(...)`` must cost a fraction of an OTel SDK span, so a phase is a
slotted ``SpanRecord`` appended to a bounded buffer; the export thread encodes the
buffer into an OTLP ``ExportTraceServiceRequest``. The user's own OTel SDK spans join
the same buffer through ``BufferProcessor`` (an ordinary ``SpanProcessor``).

Every process derives the trace id and root span id of step N from (experiment, attempt,
N) alone, so all ranks' spans of a step share one trace and one parent without talking
to each other; exactly one process emits that root span (``TracingState.taken``, on its export thread).
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.trace import SpanContext, StatusCode, TraceFlags

from ..core import names as attr


def _clock_offset(tries: int = 32) -> int:
    """``time_ns() - perf_counter_ns()`` from the wall-clock read most tightly bracketed by two
    monotonic reads of ``tries``: a process preempted between its two reads (a busy box, at
    import) would carry the gap into every span's wall time, and spans of processes that ran one
    after the other would overlap."""
    best_gap, offset = None, 0
    for _ in range(tries):
        before = time.perf_counter_ns()
        wall = time.time_ns()
        after = time.perf_counter_ns()
        if best_gap is None or after - before < best_gap:
            best_gap, offset = after - before, wall - (before + after) // 2
    return offset


CLOCK_OFFSET = _clock_offset()
"""``now_ns() == perf_ns() + CLOCK_OFFSET`` (a hot caller may inline it)."""
perf_ns = time.perf_counter_ns
random_id = random.getrandbits  # ids need uniqueness, not secrecy (the OTel SDK does the same)

_TRACE_ID_LIMIT = (1 << 64) - 1
_KIND_INTERNAL = int(trace_pb2.Span.SPAN_KIND_INTERNAL)


def now_ns() -> int:
    """Wall-clock nanoseconds on a monotonic base (one offset per process: durations never jump)."""
    return perf_ns() + CLOCK_OFFSET


class SpanRecord:
    """A finished span. Field names follow ``ReadableSpan`` so span processors can read either."""

    __slots__ = (
        "attributes",
        "end_time",
        "error",
        "events",
        "kind",
        "links",
        "name",
        "parent_id",
        "span_id",
        "start_time",
        "trace_id",
    )

    kind: int

    def __init__(
        self,
        name: str,
        trace_id: int,
        span_id: int,
        parent_id: int,
        start_time: int,
        end_time: int,
        attributes: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_id = parent_id
        self.start_time = start_time
        self.end_time = end_time
        self.attributes = attributes
        self.events: list[tuple[str, int, dict[str, Any]]] | None = None
        self.error: str | None = None
        self.kind = _KIND_INTERNAL
        self.links: list[tuple[int, int]] | None = None
        """(trace id, span id) of spans this one follows from (OTel span links)."""

    def fail(self, error: BaseException, when: int) -> None:
        """Status error plus an OTel ``exception`` event for ``error``."""
        self.error = f"{type(error).__name__}: {error}"
        details = {attr.EXCEPTION_TYPE: type(error).__name__, attr.EXCEPTION_MESSAGE: str(error)}
        self.events = [(attr.EXCEPTION_EVENT, when, details)]

    @property
    def context(self) -> SpanContext:
        return SpanContext(self.trace_id, self.span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))

    def __repr__(self) -> str:
        return f"SpanRecord({self.name!r}, trace={self.trace_id:032x}, span={self.span_id:016x})"


def step_ids(experiment: str, attempt: int, step: int) -> tuple[int, int]:
    """(trace id, root span id) of one step: the same in every process of the experiment."""
    digest = hashlib.blake2b(f"{experiment}\x00{attempt}\x00{step}".encode(), digest_size=24).digest()
    return int.from_bytes(digest[:16], "big") or 1, int.from_bytes(digest[16:], "big") or 1


def is_sampled(trace_id: int, ratio: float) -> bool:
    """The OTel ``TraceIdRatioBased`` rule: every rank keeps or drops the same steps."""
    return (trace_id & _TRACE_ID_LIMIT) < round(ratio * (_TRACE_ID_LIMIT + 1))


class SpanBuffer:
    """Bounded buffer of finished spans; what does not fit is counted, never blocks."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._spans: deque[SpanRecord] = deque()
        self.dropped = 0
        self._lock = threading.Lock()

    def add(self, span: SpanRecord) -> None:
        if len(self._spans) < self.capacity:
            self._spans.append(span)
        else:
            with self._lock:
                self.dropped += 1

    def __len__(self) -> int:
        return len(self._spans)

    def drain(self, limit: int = 1 << 30) -> list[SpanRecord]:
        out: list[SpanRecord] = []
        pop = self._spans.popleft
        try:
            while len(out) < limit:
                out.append(pop())
        except IndexError:
            pass
        return out


class BufferProcessor(SpanProcessor):
    """The last stage of every span pipeline: finished spans into the process's buffer.

    Takes rankscope's ``SpanRecord``s and the OTel SDK's ``ReadableSpan``s (a user's own
    spans from the tracer provider rankscope installs), so both leave in one OTLP stream.
    """

    def __init__(self, buffer: SpanBuffer) -> None:
        self.buffer = buffer

    def on_end(self, span: Any) -> None:
        self.buffer.add(span if isinstance(span, SpanRecord) else from_readable(span))

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def from_readable(span: ReadableSpan) -> SpanRecord:
    """An SDK span as a record (the user's own spans under rankscope's context)."""
    ctx = span.context
    parent = span.parent
    record = SpanRecord(
        span.name,
        ctx.trace_id if ctx else 0,
        ctx.span_id if ctx else 0,
        parent.span_id if parent else 0,
        span.start_time or 0,
        span.end_time or span.start_time or 0,
        dict(span.attributes or {}),
    )
    record.kind = int(span.kind.value) + 1  # SDK SpanKind starts at INTERNAL=0; OTLP at INTERNAL=1
    if span.events:
        record.events = [(e.name, e.timestamp, dict(e.attributes or {})) for e in span.events]
    if span.status is not None and span.status.status_code is StatusCode.ERROR:
        record.error = span.status.description or "error"
    return record


def span_attributes(step: int, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {attr.STEP: step}
    if extra:
        found.update(extra)
    return found
