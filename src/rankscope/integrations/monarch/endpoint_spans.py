"""Server spans and per-endpoint metrics for Monarch endpoint calls.

Made in the callee when the caller's Monarch instrumentor asked for them (``Carried.server``):
a ``SERVER`` span ``Class.endpoint`` whose parent is the caller's span, current while the
endpoint runs (so the endpoint's own spans nest under it), and per endpoint
``endpoint/{Class}.{name}/calls`` (SUM), ``/latency_s`` (MEAN), ``/latency_max_s`` (MAX),
``/failures`` (SUM, 0 or 1 per call so the series exists before the first failure).
"""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.trace.v1 import trace_pb2

from ...core import names as attr
from ...core import runtime as _slot
from ...core.errors import report_internal_error
from ...metrics.recording import record_metric
from ...metrics.reduce import Reduce
from ...tracing.spans import SpanRecord, now_ns, random_id
from ...tracing.tracer import SpanScope, enter_scope, leave_scope, tracing_of

_SERVER = int(trace_pb2.Span.SPAN_KIND_SERVER)
_SUM, _MEAN, _MAX = Reduce.SUM, Reduce.MEAN, Reduce.MAX
_keys: dict[tuple[str, str], tuple[str, str, str, str]] = {}
_coords: str | None = None


def endpoint_keys(actor: str, endpoint: str) -> tuple[str, str, str, str]:
    found = _keys.get((actor, endpoint))
    if found is None:
        base = f"endpoint/{actor}.{endpoint}"
        found = _keys[(actor, endpoint)] = (
            f"{base}/calls",
            f"{base}/latency_s",
            f"{base}/latency_max_s",
            f"{base}/failures",
        )
    return found


def _mesh_coords() -> str:
    """``procs=1,hosts=0``: this actor's point in its mesh (computed once per process)."""
    global _coords
    if _coords is None:
        try:
            from monarch.actor import current_rank

            point = current_rank()
            _coords = ",".join(f"{dim}={point[dim]}" for dim in point.keys())  # noqa: SIM118 - a Point
        except Exception:
            _coords = ""
    return _coords


class ServerCall:
    """One endpoint call in progress in the callee."""

    __slots__ = ("keys", "span", "start", "tokens")

    def __init__(self, span: SpanRecord | None, tokens: Any, start: int, keys: tuple[str, str, str, str]) -> None:
        self.span, self.tokens, self.start, self.keys = span, tokens, start, keys

    def end(self, error: BaseException | None) -> None:
        now = now_ns()
        leave_scope(self.tokens)
        try:
            seconds = (now - self.start) / 1e9
            calls, latency, latency_max, failures = self.keys
            record_metric(calls, 1, _SUM)
            record_metric(latency, seconds, _MEAN)
            record_metric(latency_max, seconds, _MAX)
            record_metric(failures, 0 if error is None or not isinstance(error, Exception) else 1, _SUM)
            span, runtime = self.span, _slot.current
            if span is not None and runtime is not None:
                span.end_time = now
                if error is not None:
                    span.fail(error, now)
                tracing_of(runtime).processor.on_end(span)
        except Exception as exc:
            report_internal_error("Monarch server span", exc)


def start_server_span(carried: Any, actor: str, endpoint: str) -> ServerCall:
    """Open the server span of one call under the caller's span and make it current."""
    start = now_ns()
    span: SpanRecord | None = None
    span_id = random_id(64) or 1
    if carried.sampled:
        span = SpanRecord(f"{actor}.{endpoint}", carried.trace_id, span_id, carried.span_id, start, 0)
        span.kind = _SERVER
        span.attributes = {
            attr.STEP: carried.step,
            attr.CALLER: carried.caller,
            attr.ACTOR_CLASS: actor,
            attr.ACTOR_ENDPOINT: endpoint,
            attr.ACTOR_COORDS: _mesh_coords(),
        }
    tokens = enter_scope(SpanScope(carried.trace_id, span_id, carried.sampled, carried.step, span=span), remote=False)
    return ServerCall(span, tokens, start, endpoint_keys(actor, endpoint))
