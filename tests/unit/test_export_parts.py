"""The export path's parts, each alone: no export thread, no socket.

The outboxes send through an ``Endpoint`` over a scripted ``Sender`` (it answers each attempt as
told and keeps the bytes), so what goes out, in which order, what stays held after a failed
attempt and what is counted as lost are read directly. The requests are parsed back with the
OTLP protobuf classes.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections import deque
from typing import Any

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.sdk.resources import Resource

from rankscope.backends.base import Metric
from rankscope.core import names as attr
from rankscope.export import senders as senders_module
from rankscope.export.drops import Drops
from rankscope.export.encode import MAX_ROW_CHARS_PER_REQUEST, encode_steps, row_chunk
from rankscope.export.endpoint import RETRY_AFTER_MAX, Endpoint
from rankscope.export.inbox import Inbox
from rankscope.export.outboxes import MetricOutbox, RowOutbox, SpanOutbox, StepBound, StreamOutbox
from rankscope.export.senders import SENT, Attempt, Signal, is_sink_http_port
from rankscope.metrics.recorder import Recorder, StepBatch
from rankscope.metrics.reduce import MetricAccumulator, Reduce
from rankscope.metrics.samples import Kept, Provenance
from rankscope.otlp.common import encode_resource
from rankscope.otlp.templates import MetricEncoder, SpanEncoder
from rankscope.tracing.spans import SpanBuffer, SpanRecord

RESOURCE = Resource.create({"service.name": "trainer", attr.EXPERIMENT_ID: "parts"})
RESOURCE_PB = encode_resource(RESOURCE.attributes)
SCOPE = InstrumentationScope(name=attr.INSTRUMENTATION_SCOPE, version="0")
RETRY = Attempt(False, retry=True, detail="UNAVAILABLE: down")
REFUSED = Attempt(False, detail="INVALID_ARGUMENT: no")
SLOW = Attempt(False, retry=True, detail="DEADLINE_EXCEEDED: Deadline Exceeded", slow=True)


class ScriptedSender:
    """A ``Sender`` that answers from a script (then ``SENT``) and keeps what it was sent."""

    target = "the scripted endpoint"

    def __init__(self, *answers: Attempt) -> None:
        self.answers = deque(answers)
        self.sent: list[tuple[Signal, bytes]] = []
        self.tried = 0

    def send(self, signal: Signal, payload: bytes, timeout: float | None = None) -> Attempt:
        self.tried += 1
        answer = self.answers.popleft() if self.answers else SENT
        if answer.sent:
            self.sent.append((signal, payload))
        return answer

    def shutdown(self, timeout_millis: float = 30_000) -> None:
        pass


def _drops(buffer: SpanBuffer | None = None) -> Drops:
    return Drops(RESOURCE, buffer if buffer is not None else SpanBuffer(16), lambda: "the scripted endpoint")


def _batch(step: int | None, keys: int, value: float = 1.0) -> StepBatch:
    accs: dict[str, MetricAccumulator] = {}
    for i in range(keys):
        acc = accs[f"k{i}"] = Reduce.MEAN.accumulator_class(Reduce.MEAN)
        acc.append(value)
    batch = StepBatch(step, 10, 20, accs, None)
    batch.held_points = keys
    return batch


def _metric_names(payload: bytes) -> list[str]:
    request = ExportMetricsServiceRequest.FromString(payload)
    return [m.name for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics]


def _steps_of(payload: bytes) -> list[int]:
    """The steps whose flush markers a request carries, in order."""
    request = ExportMetricsServiceRequest.FromString(payload)
    steps: list[int] = []
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == attr.FLUSH_MARKER:
                    point = m.sum.data_points[0]
                    steps.extend(kv.value.int_value for kv in point.attributes if kv.key == attr.STEP)
    return steps


# -- the encode stage ------------------------------------------------------------------


def test_encode_steps_never_splits_a_step_and_leads_with_the_given_request() -> None:
    before = ExportMetricsServiceRequest()
    before.resource_metrics.add().scope_metrics.add().metrics.add(name="sdk.counter")
    made = encode_steps(
        MetricEncoder(RESOURCE_PB, SCOPE),
        [_batch(0, 5), _batch(1, 5), _batch(2, 2)],
        goodbye=True,
        before=bytes(before.SerializeToString()),
        max_points=8,
    )
    assert [(e.steps, e.points, e.held_points) for e in made] == [(1, 5, 5), (2, 7, 7)]
    assert _metric_names(made[0].request)[0] == "sdk.counter"  # leads the first request only
    assert "sdk.counter" not in _metric_names(made[1].request)
    assert [_steps_of(e.request) for e in made] == [[0], [1, 2]]
    assert _metric_names(made[-1].request)[-1] == attr.GOODBYE


def test_encode_steps_of_nothing_is_no_request_and_a_periodic_step_has_no_marker() -> None:
    encoder = MetricEncoder(RESOURCE_PB, SCOPE)
    assert encode_steps(encoder, [], goodbye=False) == []
    (made,) = encode_steps(encoder, [_batch(None, 3)], goodbye=False)
    assert _metric_names(made.request) == ["k0", "k1", "k2"] and _steps_of(made.request) == []


def test_a_first_step_after_periodic_exports_is_timed_from_the_processs_start_its_points_after_them() -> None:
    """A process asked for a periodic export before its first flush (torchrun's first collective
    served the ask): the step's start stays the recorder's, so its flush marker (what the sink times a
    run's first step from) and the in-process views count from it; its points start where the
    periodic export's ended, so delta intervals never overlap."""
    recorder = Recorder(streams=[])
    began = recorder._step_start
    recorder.record("loss", 1.0, Reduce.MEAN)
    periodic = recorder.take(None)
    recorder.record("loss", 2.0, Reduce.MEAN)
    first = recorder.take(0)
    recorder.record("loss", 3.0, Reduce.MEAN)
    second = recorder.take(1)
    assert periodic is not None and first is not None and second is not None
    assert periodic.start_time_unix_nano == first.start_time_unix_nano == began < periodic.time_unix_nano
    assert second.start_time_unix_nano == first.time_unix_nano  # each step from the one before
    outbox = MetricOutbox(_drops(), StepBound(10), MetricEncoder(RESOURCE_PB, SCOPE))
    outbox.add_steps([periodic], goodbye=False)
    outbox.add_steps([first, second], goodbye=False)
    points = [
        (m.name, p.start_time_unix_nano, p.time_unix_nano)
        for encoded in outbox._unsent
        for rm in ExportMetricsServiceRequest.FromString(encoded.request).resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        for p in (m.sum.data_points or m.gauge.data_points or m.histogram.data_points)
    ]
    t0, t1, t2 = periodic.time_unix_nano, first.time_unix_nano, second.time_unix_nano
    assert [(name, start, end) for name, start, end in points if name == attr.FLUSH_MARKER] == [
        (attr.FLUSH_MARKER, began, t1),
        (attr.FLUSH_MARKER, t1, t2),
    ]
    data = sorted((start, end) for name, start, end in points if name != attr.FLUSH_MARKER)
    assert data[0] == (began, t0) and (t0, t1) in data and (t1, t2) in data


def test_row_chunks_are_bounded_by_rows_and_characters_and_take_at_least_one() -> None:
    def row(chars: int) -> Any:
        return ("t", None, 1, Kept(0.0, 0, "top", {"text": "x" * chars}, Provenance(0)), 0)

    held = deque([row(MAX_ROW_CHARS_PER_REQUEST), row(10), row(10)])
    assert len(row_chunk(held)) == 1  # one huge row still goes, alone
    assert len(row_chunk(held)) == 2 and not held
    held = deque(row(1) for _ in range(600))
    assert len(row_chunk(held)) == 512 and len(held) == 88


# -- the metric outbox -------------------------------------------------------------------


def test_a_failed_attempt_keeps_the_steps_in_order_and_the_bound_until_they_are_sent() -> None:
    bound, drops = StepBound(3), _drops()
    outbox = MetricOutbox(drops, bound, MetricEncoder(RESOURCE_PB, SCOPE))
    for _ in range(3):
        assert bound.hold(4)
    outbox.add_steps([_batch(0, 4), _batch(1, 4)], goodbye=False)
    outbox.add_steps([_batch(2, 4)], goodbye=False)
    sender = ScriptedSender(RETRY)
    endpoint = Endpoint(sender, 3)
    assert outbox.send(endpoint, None) is RETRY
    assert outbox.held() and sender.sent == [] and not bound.hold(0)  # still held: the bound is full
    assert outbox.send(endpoint, None) is None and not outbox.held()
    assert [_steps_of(p) for _, p in sender.sent] == [[0, 1], [2]]
    assert [s for s, _ in sender.sent] == ["metrics", "metrics"]
    assert bound.hold(0) and drops.total == 0  # released as they were sent


def test_a_refused_request_is_dropped_and_counted_with_its_reason_and_the_rest_go_on() -> None:
    bound, drops = StepBound(10), _drops()
    outbox = MetricOutbox(drops, bound, MetricEncoder(RESOURCE_PB, SCOPE))
    outbox.add_steps([_batch(0, 3)], goodbye=False)
    outbox.add_steps([_batch(1, 2)], goodbye=False)
    sender = ScriptedSender(REFUSED)
    with pytest.warns(RuntimeWarning, match=r"refused an export \(INVALID_ARGUMENT: no\)"):
        assert outbox.send(Endpoint(sender, 10), None) is None
    assert drops.total == 3 and [_steps_of(p) for _, p in sender.sent] == [[1]]


def test_an_endpoint_refusing_every_request_is_one_episode_said_once_until_one_goes_through() -> None:
    """A wrong token: every request is refused for good. No round ends the episode as if export had
    recovered (a line a round, for as long as the job runs); the first request taken does."""
    bound, drops = StepBound(10), _drops()
    outbox = MetricOutbox(drops, bound, MetricEncoder(RESOURCE_PB, SCOPE))
    endpoint = Endpoint(ScriptedSender(REFUSED, REFUSED, REFUSED), 10)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for step in range(3):
            outbox.add_steps([_batch(step, 3)], goodbye=False)
            assert outbox.send(endpoint, None) is None
            drops.report(final=False)  # the round ended without a failure to retry
    assert [str(w.message) for w in said] == [
        "rankscope: dropping metric points because the OTLP endpoint refused an export (INVALID_ARGUMENT: no); "
        "the job is unaffected and the count is reported when export recovers"
    ]
    assert drops.total == 9
    outbox.add_steps([_batch(3, 3)], goodbye=False)
    assert outbox.send(endpoint, None) is None  # taken
    with pytest.warns(RuntimeWarning, match=r"9 metric points were dropped before export recovered \(9 in total\)"):
        drops.report(final=False)


def test_one_slow_answer_is_not_said_as_an_outage_two_in_a_row_are_and_a_refusal_is_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A sink still starting on a busy machine misses one deadline and answers the next round: the
    job says nothing. Missing the next deadline too is an outage; so is a refused connection."""
    endpoint = Endpoint(ScriptedSender(), 10)

    def said() -> list[str]:
        lines = [r.getMessage() for r in caplog.records if r.name == "rankscope"]
        caplog.clear()
        return lines

    with caplog.at_level(logging.WARNING, logger="rankscope"):
        endpoint.failed(SLOW)
        endpoint.recovered()
        assert said() == [] and endpoint.failures == 0
        endpoint.failed(SLOW)
        endpoint.failed(SLOW)
        (down,) = said()
        assert "does not take exports (DEADLINE_EXCEEDED: Deadline Exceeded)" in down
        endpoint.recovered()
        (back,) = said()
        assert "the scripted endpoint answers again after" in back
        endpoint.failed(RETRY)
        (refused,) = said()
        assert "does not take exports (UNAVAILABLE: down)" in refused


def test_relayed_requests_count_in_the_step_bound_and_go_as_they_came() -> None:
    bound, drops = StepBound(1), _drops()
    outbox = MetricOutbox(drops, bound, MetricEncoder(RESOURCE_PB, SCOPE))
    (child,) = encode_steps(MetricEncoder(RESOURCE_PB, SCOPE), [_batch(7, 2)], goodbye=False)
    outbox.relay(child.request)
    with pytest.warns(RuntimeWarning, match="the export queue is full"):
        outbox.relay(child.request)  # the bound (1 step) is full: its 3 metrics are lost, counted
    assert drops.total == 3
    sender = ScriptedSender()
    assert outbox.send(Endpoint(sender, 1), None) is None
    assert sender.sent == [("metrics", child.request)]


def test_abandon_at_shutdown_counts_what_is_left_without_a_second_warning() -> None:
    bound, drops = StepBound(10), _drops()
    outbox = MetricOutbox(drops, bound, MetricEncoder(RESOURCE_PB, SCOPE))
    assert bound.hold(6)
    outbox.add_steps([_batch(0, 6)], goodbye=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        outbox.abandon("shutdown ended before the endpoint answered")
    assert drops.total == 6 and not outbox.held() and bound.clear() == 0
    with pytest.warns(RuntimeWarning, match="6 metric points were dropped at shutdown: the scripted endpoint"):
        drops.report(final=True)


# -- spans, streams, rows ------------------------------------------------------------------


def _span(i: int) -> SpanRecord:
    return SpanRecord(f"s{i}", 1, i + 1, 0, 10, 20, {attr.STEP: 0})


def test_spans_wait_as_one_chunk_after_a_failure_and_refusals_are_counted() -> None:
    buffer = SpanBuffer(100)
    drops = _drops(buffer)
    outbox = SpanOutbox(buffer, drops, SpanEncoder(RESOURCE_PB, SCOPE))
    for i in range(3):
        buffer.add(_span(i))
    assert outbox.fresh() and not outbox.held()
    sender = ScriptedSender(RETRY)
    assert outbox.send(Endpoint(sender, 1), None) is RETRY
    assert outbox.held() and len(buffer) == 0  # the chunk waits in the outbox, the buffer takes new spans
    buffer.add(_span(3))
    assert outbox.send(Endpoint(sender, 1), None) is None
    names = [
        [s.name for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]
        for r in (ExportTraceServiceRequest.FromString(p) for _, p in sender.sent)
    ]
    assert names == [["s0", "s1", "s2"], ["s3"]]
    buffer.add(_span(4))
    with pytest.warns(RuntimeWarning, match="dropping spans"):
        outbox.send(Endpoint(ScriptedSender(REFUSED), 1), None)
    assert buffer.dropped == 1
    buffer.add(_span(5))
    with pytest.warns(RuntimeWarning, match="1 spans were dropped"):
        outbox.send(Endpoint(ScriptedSender(), 1), None)


def test_streamed_values_wait_as_the_same_request_and_beyond_their_limit_the_oldest_are_dropped() -> None:
    drops = _drops()
    outbox = StreamOutbox(drops, RESOURCE_PB, SCOPE)
    outbox.LIMIT = 3
    for i in range(8):
        outbox.add(Metric("loss", float(i), Reduce.MEAN, 1.0), i)
    away = ScriptedSender(RETRY)
    with pytest.warns(RuntimeWarning, match="too many streamed values"):
        assert outbox.send(Endpoint(away, 1), None) is RETRY  # 0-2 in the request, 3-4 dropped, 5-7 wait
    outbox.add(Metric("loss", 8.0, Reduce.MEAN, 1.0), 8)
    sender = ScriptedSender()
    assert outbox.send(Endpoint(sender, 1), None) is None and not outbox.held()
    bodies = [
        [r.body.string_value for r in ExportLogsServiceRequest.FromString(p).resource_logs[0].scope_logs[0].log_records]
        for _, p in sender.sent
    ]
    assert bodies == [["loss: 0.0", "loss: 1.0", "loss: 2.0"], ["loss: 5.0", "loss: 6.0", "loss: 7.0"], ["loss: 8.0"]]
    assert drops.total == 2


def test_a_retried_stream_request_is_the_same_bytes() -> None:
    outbox = StreamOutbox(_drops(), RESOURCE_PB, SCOPE)
    outbox.add(Metric("loss", 1.0, Reduce.MEAN, 1.0), 0)

    class Keeping(ScriptedSender):
        def send(self, signal: Signal, payload: bytes, timeout: float | None = None) -> Attempt:
            self.tried_payloads = [*getattr(self, "tried_payloads", []), payload]
            return super().send(signal, payload, timeout)

    sender = Keeping(RETRY)
    outbox.send(Endpoint(sender, 1), None)
    outbox.add(Metric("loss", 2.0, Reduce.MEAN, 1.0), 1)  # arrives while the first request waits
    outbox.send(Endpoint(sender, 1), None)
    first, again, second = sender.tried_payloads
    assert again == first and second != first and len(sender.sent) == 2


def test_held_rows_are_bounded_and_selections_leave_before_streamed_rows() -> None:
    drops = _drops()
    outbox = RowOutbox(drops, RESOURCE_PB, SCOPE)
    outbox.MAX_HELD_ROWS = 2
    for i in range(3):
        outbox.stream("all", {"i": i}, Provenance(0), 0)
    assert drops.rows == 1
    sender = ScriptedSender()
    outbox.relay(ExportLogsServiceRequest().SerializeToString())
    assert outbox.send(Endpoint(sender, 1), None) is None and not outbox.held()
    assert len(sender.sent) == 2 and all(signal == "logs" for signal, _ in sender.sent)


# -- the step bound, the endpoint's backoff, the inbox ---------------------------------------


def test_the_step_bound_holds_at_most_its_steps() -> None:
    bound = StepBound(2)
    assert bound.hold(3) and bound.hold(4) and not bound.hold(1)
    bound.release(1, 3)
    assert bound.hold(1) and bound.clear() == 5


def test_the_backoff_doubles_is_capped_follows_the_endpoints_hint_and_resets() -> None:
    endpoint = Endpoint(ScriptedSender(), 300)
    waits = []
    for _ in range(5):
        endpoint.failed(RETRY)
        waits.append(endpoint.next_attempt - time.monotonic())
    assert 0.39 < waits[0] <= 0.6 and 0.79 < waits[1] <= 1.2 and all(1.59 < w <= 2.4 for w in waits[2:])
    endpoint.failed(Attempt(False, retry=True, retry_after=1e6))  # a hint beyond the cap is capped
    assert RETRY_AFTER_MAX - 1 < endpoint.next_attempt - time.monotonic() <= RETRY_AFTER_MAX
    endpoint.failed(Attempt(False, retry=True, retry_after=5.0))  # the endpoint's own hint
    assert 4 < endpoint.next_attempt - time.monotonic() <= 5.0
    endpoint.recovered()
    assert endpoint.failures == 0 and endpoint.ready(time.monotonic())


def test_an_exception_in_a_sender_is_a_refused_attempt_warned_once() -> None:
    class Broken(ScriptedSender):
        def send(self, signal: Signal, payload: bytes, timeout: float | None = None) -> Attempt:
            raise OSError("no sink could start")

    endpoint = Endpoint(Broken(), 1)
    with pytest.warns(RuntimeWarning, match="no sink could be reached"):
        first = endpoint.attempt("metrics", b"", None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = endpoint.attempt("metrics", b"", None)
    assert not first.sent and not first.retry and not second.sent and endpoint.requests == 2


def test_the_inbox_is_bounded_but_never_refuses_an_urgent_message() -> None:
    inbox: Inbox[int] = Inbox(2)
    assert inbox.put(1) and inbox.put(2) and not inbox.put(3)
    assert inbox.put(4, urgent=True)
    assert inbox.take(0.0, idle=False, most=2) == [1, 2] and inbox.take(0.0, idle=False, most=9) == [4]
    assert inbox.take(0.01, idle=True, most=9) == []  # nothing came: it waited and returned


# -- a transport's answers, classified -----------------------------------------------------


class _Result:
    def __init__(self, status: int | None, retry_after: str | None = None) -> None:
        self.status_code, self.reason, self.error = status, "why", "refused"
        self._headers = {} if retry_after is None else {"retry-after": retry_after}

    def headers(self) -> dict[str, str]:
        return self._headers


class _Client:
    _timeout = 10.0

    def __init__(self, result: _Result) -> None:
        self.result = result
        self.posted: list[tuple[bytes, float]] = []

    def _compress(self, data: bytes) -> bytes:
        return data

    def _submit(self, data: bytes, timeout: float) -> _Result:
        self.posted.append((data, timeout))
        return self.result


class _Exporter:
    _shutdown = False

    def __init__(self, result: _Result) -> None:
        self._client = _Client(result)


@pytest.mark.parametrize(
    ("status", "retry_after", "sent", "retry", "hint"),
    [
        (200, None, True, False, None),
        (503, "7", False, True, 7.0),
        (429, None, False, True, None),
        (400, None, False, False, None),
        (None, None, False, True, None),  # no answer at all: the connection was refused
    ],
)
def test_http_answers_are_sent_retried_or_refused(
    status: int | None, retry_after: str | None, sent: bool, retry: bool, hint: float | None
) -> None:
    exporter = _Exporter(_Result(status, retry_after))
    attempt = senders_module._HttpTransport(exporter, "metrics").send(b"payload", 3.0)
    assert (attempt.sent, attempt.retry, attempt.retry_after) == (sent, retry, hint)
    assert exporter._client.posted == [(b"payload", 3.0)]  # one POST with the round's deadline, no retry loop


def test_a_taken_requests_partial_success_is_read_and_a_bad_answer_is_taken_as_sent() -> None:
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse

    from rankscope.export.senders import SENT, taken

    answer = ExportMetricsServiceResponse()
    answer.partial_success.rejected_data_points = 7
    answer.partial_success.error_message = "run refused:\n\tquota"
    found = taken("metrics", answer.SerializeToString())
    assert found.sent and found.rejected == 7 and found.detail == "run refused: quota"
    assert taken("metrics", b"") is SENT and taken("metrics", None) is SENT
    assert taken("spans", b"\xff\xfe not protobuf") is SENT  # the request was taken; its answer unreadable
    assert taken("logs", ExportMetricsServiceResponse().SerializeToString()) is SENT
    answer.partial_success.error_message = "quota\x1b[2J\x07 full"  # a terminal escape from the wire
    assert taken("metrics", answer.SerializeToString()).detail == "quota [2J full"


@pytest.mark.parametrize(
    ("endpoint", "control", "is_it"),
    [
        ("http://127.0.0.1:4318", "http://127.0.0.1:4318", True),  # as ``rankscope run`` sets both
        ("http://127.0.0.1:4318/", "http://127.0.0.1:4318", True),
        ("127.0.0.1:4318", "http://127.0.0.1:4318/", True),  # a bare host:port is plaintext
        ("HTTP://Sink.Local:4318", "http://sink.local:4318", True),
        ("http://sink.local", "http://sink.local:80", True),
        ("127.0.0.1:4317", "http://127.0.0.1:4318", False),  # the sink's gRPC port: the protocol set stays
        ("http://localhost:4318", "http://127.0.0.1:4318", False),  # no lookup
        ("https://sink.example", "https://sink.example", False),  # an ingress may route gRPC there
        ("http://127.0.0.1:4318/otlp", "http://127.0.0.1:4318", False),
        ("http://127.0.0.1:4318", "http://[::1:4318", False),  # a malformed control URL
        (None, "http://127.0.0.1:4318", False),
    ],
)
def test_the_sinks_own_http_port_is_known_by_its_control_url(endpoint: str | None, control: str, is_it: bool) -> None:
    assert is_sink_http_port(endpoint, control) is is_it
