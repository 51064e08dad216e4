"""The shutdown drain with a sink this job owns, on a real export thread over a scripted sender.

The newcomer's symptom (``torchrun ... examples/spmd_torchrun.py`` on a busy box): rank 0, which
starts the embedded sink, shut down while the sink was still starting or too busy to answer
within ``RANKSCOPE_SHUTDOWN_TIMEOUT``, and dropped its last steps (``DEADLINE_EXCEEDED``, then
``4 metric points were dropped at shutdown``). Here the sink's start and its slowness are
scripted; the end-to-end check under real load is ``tests/e2e/test_embedded_sink_load.py``.
"""

from __future__ import annotations

import time
import warnings
from collections import deque

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.sdk.resources import Resource

from rankscope.core import names as attr
from rankscope.export.local_views import BackendSet
from rankscope.export.senders import SENT, Attempt, EmbeddedSender, Signal
from rankscope.export.thread import ExportThread
from rankscope.metrics.recorder import Recorder, StepBatch
from rankscope.metrics.reduce import MetricAccumulator, Reduce

RESOURCE = Resource.create({"service.name": "trainer", attr.EXPERIMENT_ID: "drain", attr.RANK: "0"})
LATE = Attempt(False, retry=True, detail="DEADLINE_EXCEEDED: Deadline Exceeded")


class OwnedSink(EmbeddedSender):
    """A sink this job owns: connecting takes ``start`` seconds, then each attempt answers from the
    script (then ``SENT``); ``alive`` is what the test says."""

    def __init__(self, *answers: Attempt, start: float = 0.0, alive: bool = True) -> None:
        super().__init__(lambda: ("127.0.0.1:1", "http://127.0.0.1:2"), "grpc")
        self.answers = deque(answers)
        self.start = start
        self.is_alive = alive
        self.steps: list[int] = []
        self.timeouts: list[float | None] = []

    def send(self, signal: Signal, payload: bytes, timeout: float | None = None) -> Attempt:
        if self.ready_at is None:
            self.connecting = True
            time.sleep(self.start)  # the embedded sink starting on a busy box
            self.control_url, self.ready_at, self.connecting = "http://127.0.0.1:2", time.monotonic(), False
        self.timeouts.append(timeout)
        answer = self.answers.popleft() if self.answers else SENT
        if answer.sent and signal == "metrics":
            self.steps.extend(_steps(payload))
        return answer

    def alive(self) -> bool:
        return self.is_alive

    def shutdown(self, timeout_millis: float = 30_000) -> None:
        pass


def _steps(payload: bytes) -> list[int]:
    request = ExportMetricsServiceRequest.FromString(payload)
    return [
        kv.value.int_value
        for rm in request.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == attr.FLUSH_MARKER
        for kv in m.sum.data_points[0].attributes
        if kv.key == attr.STEP
    ]


def _thread(sender: EmbeddedSender, connect_at_start: bool = False) -> ExportThread:
    return ExportThread(
        connect_at_start=connect_at_start,
        resource=RESOURCE,
        recorder=Recorder(streams=[]),
        backends=BackendSet([], {}, "trainer_r0"),
        sender=sender,
        export_interval=1.0,
        max_queued_steps=300,
        periodic=lambda: False,
        on_error=lambda where, exc: (_ for _ in ()).throw(exc),
    )


def _flush(thread: ExportThread, steps: range) -> None:
    for step in steps:
        acc: MetricAccumulator = Reduce.SUM.accumulator_class(Reduce.SUM)
        acc.append(16.0)
        thread.submit(StepBatch(step, 10, 20, {"tokens": acc}, None))


def _shutdown(thread: ExportThread, timeout: float) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        thread.shutdown(timeout)
    return [str(w.message) for w in caught]


def test_the_starter_waits_for_its_sink_to_start_before_the_drain_counts() -> None:
    """Shutdown comes while the first export is still starting the sink (longer than the timeout)."""
    sink = OwnedSink(start=0.8)
    thread = _thread(sink)
    _flush(thread, range(3))
    time.sleep(0.1)  # the export thread is starting the sink now
    assert sink.connecting
    warned = _shutdown(thread, timeout=0.2)
    assert sorted(set(sink.steps)) == [0, 1, 2] and thread.dropped_total == 0, warned
    assert not any("dropped" in w for w in warned), warned


def test_an_export_past_its_deadline_is_retried_while_the_sink_is_alive() -> None:
    """The sink is up but too busy to answer in time: DEADLINE_EXCEEDED twice, then it answers."""
    sink = OwnedSink(LATE, LATE)
    thread = _thread(sink)
    _flush(thread, range(3))
    warned = _shutdown(thread, timeout=0.2)
    assert sorted(set(sink.steps)) == [0, 1, 2] and thread.dropped_total == 0, warned
    assert len(sink.timeouts) >= 3 and max(t or 0.0 for t in sink.timeouts[1:]) > 0.2  # past the deadline


def test_a_sink_that_is_gone_is_not_waited_for() -> None:
    sink = OwnedSink(*[LATE] * 100, alive=False)
    thread = _thread(sink)
    _flush(thread, range(3))
    began = time.monotonic()
    warned = _shutdown(thread, timeout=0.2)
    assert time.monotonic() - began < 3.0
    assert thread.dropped_total == 3 and any("dropped at shutdown" in w for w in warned), warned


def test_the_drain_past_the_deadline_is_bounded() -> None:
    """Alive but never answering: the drain ends (at ``OWNED_SINK_DRAIN``, shortened here) and counts."""
    from rankscope.export import rounds

    sink = OwnedSink(*[LATE] * 1000)
    thread = _thread(sink)
    _flush(thread, range(2))
    saved, rounds.OWNED_SINK_DRAIN = rounds.OWNED_SINK_DRAIN, 1.5
    try:
        began = time.monotonic()
        warned = _shutdown(thread, timeout=0.2)
    finally:
        rounds.OWNED_SINK_DRAIN = saved
    assert time.monotonic() - began < 4.0 and len(sink.timeouts) >= 2  # retried past the deadline, then gave up
    assert thread.dropped_total == 2 and any("dropped at shutdown" in w for w in warned), warned


class Starts:
    """A sink's ``connect`` function: each call counted; it starts, or fails with ``error``."""

    def __init__(self, error: Exception | None = None) -> None:
        self.calls = 0
        self.error = error

    def __call__(self) -> tuple[str, str]:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return "127.0.0.1:1", "http://127.0.0.1:2"


class Starting(EmbeddedSender):
    """A sink this job owns whose start is ``starts``; its sends go nowhere, answered as taken."""

    def send(self, signal: Signal, payload: bytes, timeout: float | None = None) -> Attempt:
        self.connect()
        return SENT

    def alive(self) -> bool:
        return False

    def shutdown(self, timeout_millis: float = 30_000) -> None:
        pass


def test_an_explicit_init_starts_the_sink_as_its_export_thread_starts_not_at_the_first_send() -> None:
    """The sink's start (seconds on a busy box) overlaps the job's setup: before, the first steps'
    lines waited for it. An automatic init (``connect_at_start`` off) still starts it at its first send."""
    for connect_at_start in (True, False):
        starts = Starts()
        thread = _thread(Starting(starts, "http/protobuf"), connect_at_start=connect_at_start)
        assert thread.flush(10.0)  # the thread is past its start, nothing flushed: no send
        assert starts.calls == (1 if connect_at_start else 0), connect_at_start
        _shutdown(thread, timeout=0.2)  # the goodbye: a send, which starts a sink not started yet
        assert starts.calls == 1


def test_a_sink_that_could_not_start_is_tried_once_and_said_by_the_first_send() -> None:
    """The start's error is not lost at the thread's start: the first send raises it (the endpoint
    warns once and counts the drop), later sends are refused without another start."""
    starts = Starts(OSError("the embedded sink did not start in 60 s"))
    sink = EmbeddedSender(starts, "grpc")
    sink.connect()
    assert starts.calls == 1 and not sink.connecting and sink.control_url is None
    try:
        sink.send("metrics", b"")
    except OSError as exc:
        assert "did not start" in str(exc)
    else:
        raise AssertionError("the first send did not say why the sink is missing")
    again = sink.send("metrics", b"")
    assert not again.sent and again.detail == "no sink" and starts.calls == 1
