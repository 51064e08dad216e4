"""An endpoint that is down for a while: steps wait in the SDK's bounded queue and go out when it is back.

Real components only: the SDK's real OTLP/gRPC exporters, a real sink started late on a fixed
port, a real socket that accepts connections and never answers. Each test is bounded in time.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import rankscope as rs
from rankscope.export import _otel_sdk
from rankscope.export.senders import make_sender
from rankscope.sink import BookConfig, Sink

from ..conftest import free_port

KEYS = 50


def _views(directory: Path) -> dict[str, Any]:
    return {"jsonl": {"logging_mode": "global_reduce", "path": str(directory / "{experiment}.jsonl")}}


def _rows(directory: Path, experiment: str) -> dict[int, dict[str, float]]:
    """{step: {key: value}} of the experiment's global view (a late update overwrites its step)."""
    found: dict[int, dict[str, float]] = {}
    path = directory / f"{experiment}.jsonl"
    for row in map(json.loads, path.read_text().splitlines() if path.exists() else []):
        if row["kind"] == "anomaly":  # a view's record of a step, not a value (a slow step on a busy box)
            continue
        found.setdefault(row["step"], {})[row["key"]] = row["value"]
    return found


def _step(step: int) -> None:
    """Record KEYS keys and close the step."""
    for k in range(KEYS):
        rs.record_metric(f"k{k}", float(step + k))
    rs.record_metric("steps", 1, rs.Reduce.SUM)
    rs.flush(step)


def _wait_written(sink: Sink, experiment: str, step: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ((sink.status(experiment) or {}).get("last_written_step") or -1) >= step:
            return
        time.sleep(0.05)
    raise AssertionError(f"step {step} of {experiment} not written: {sink.status(experiment)}")


@contextmanager
def _silent_endpoint(port: int) -> Iterator[None]:
    """A TCP endpoint that accepts connections and never answers (a hung Collector)."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen(64)  # the kernel completes handshakes; nobody ever reads
    try:
        yield
    finally:
        server.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("outage", "protocol"), [("refused", "grpc"), ("silent", "grpc"), ("refused", "http/protobuf")]
)
def test_steps_flushed_while_the_endpoint_is_down_all_arrive_once_it_is_back(
    outage: str,
    protocol: str,
    make_sink: Callable[..., Sink],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Connection refused (nothing listens) or no answer at all (every attempt runs into its
    deadline), over OTLP/gRPC or OTLP/HTTP: no step is lost, nothing is counted as dropped, and
    the caller never waits for the endpoint: every send is made on the export thread (what a flush
    costs meanwhile is measured by ``benchmarks/bench_flush.py``)."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")  # one attempt's deadline against the silent endpoint
    sending_threads: set[int] = set()
    for name in ("grpc_export", "http_post"):  # where every OTLP request leaves the process
        real = getattr(_otel_sdk, name)

        def recorded(*args: Any, _real: Callable[..., Any] = real, **kwargs: Any) -> Any:
            sending_threads.add(threading.get_ident())
            return _real(*args, **kwargs)

        monkeypatch.setattr(_otel_sdk, name, recorded)
    port = free_port()
    rs.init(experiment=f"outage-{outage}", role="trainer", endpoint=f"127.0.0.1:{port}", protocol=protocol)

    def run_down(steps: range) -> None:  # 4 s of steps while the endpoint is down
        for step in steps:
            _step(step)
            time.sleep(0.1)
        # Every flush returned while nothing could take the steps: they are held, neither sent nor dropped,
        # and the attempts to send them were made off the caller's thread.
        assert not rs.force_flush(0.2) and rs.dropped_points() == 0
        assert sending_threads and threading.get_ident() not in sending_threads

    with caplog.at_level(logging.WARNING, logger="rankscope"):
        if outage == "silent":
            with _silent_endpoint(port):
                run_down(range(40))
        else:
            run_down(range(40))
        ports = {"grpc_port": port} if protocol == "grpc" else {"http_port": port}
        sink = make_sink(**ports, backends=_views(tmp_path), book=BookConfig(grace=30))
        for step in range(40, 60):
            _step(step)
            time.sleep(0.05)
        assert rs.force_flush(30)
        _wait_written(sink, f"outage-{outage}", 59)
    assert rs.dropped_points() == 0
    rows = _rows(tmp_path, f"outage-{outage}")
    assert sorted(rows) == list(range(60))
    for step, values in rows.items():
        assert values["steps"] == 1.0 and values["k0"] == float(step) and values[f"k{KEYS - 1}"] == step + KEYS - 1.0
        assert values["rankscope/missing_processes"] == 0.0
    said = [r.getMessage() for r in caplog.records if r.name == "rankscope"]
    assert sum("does not take exports (" in m for m in said) == 1, said
    assert sum("answers again" in m for m in said) == 1, said


@pytest.mark.timeout(60)
def test_only_the_steps_that_overflow_the_queue_are_dropped_and_counted(
    make_sink: Callable[..., Sink], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANKSCOPE_MAX_QUEUED_STEPS", "5")
    port = free_port()
    rs.init(experiment="overflow", role="trainer", endpoint=f"127.0.0.1:{port}")
    with pytest.warns(RuntimeWarning, match="5 flushed steps are already waiting"):
        for step in range(20):
            _step(step)
    assert rs.dropped_points() == 15 * (KEYS + 1)  # steps 5..19, every key of each
    sink = make_sink(grpc_port=port, backends=_views(tmp_path), book=BookConfig(grace=30))
    assert rs.force_flush(30)
    _wait_written(sink, "overflow", 4)
    for step in range(20, 23):  # the queue has room again
        _step(step)
    assert rs.force_flush(30)
    _wait_written(sink, "overflow", 22)
    rows = _rows(tmp_path, "overflow")
    # The SDK's count of what it dropped has no step: it lands by its time, in the first step it lost.
    assert rows.pop(5) == {
        "rankscope.dropped_points": 15.0 * (KEYS + 1),
        "rankscope/missing_processes": 0.0,
        "rankscope/nonfinite_values": 0.0,
    }
    assert sorted(rows) == [0, 1, 2, 3, 4, 20, 21, 22]
    assert all(rows[s]["steps"] == 1.0 and rows[s]["k0"] == float(s) for s in rows)
    assert rs.dropped_points() == 15 * (KEYS + 1)
    # A refused step's points are dropped, not its root span: its other spans have a parent.
    roots = {span.step for span in sink.spans("overflow") or [] if span.name == "step"}
    assert roots == set(range(23))


@pytest.mark.timeout(20)  # the bound: RANKSCOPE_SHUTDOWN_TIMEOUT is 1.5 s here
def test_shutdown_while_the_endpoint_is_down_is_bounded_and_counts_what_is_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RANKSCOPE_SHUTDOWN_TIMEOUT", "1.5")
    rs.init(experiment="gone", endpoint=f"127.0.0.1:{free_port()}")
    for step in range(10):
        _step(step)
    with pytest.warns(RuntimeWarning, match="dropp") as said:
        rs.shutdown()  # bounded: the test's time limit fails it if shutdown waited on retries
    messages = [str(w.message) for w in said]
    assert len(messages) == 1, messages  # one line at exit: how many, and why
    assert f"{10 * (KEYS + 1)} metric points were dropped at shutdown" in messages[0], messages
    assert "did not take them within RANKSCOPE_SHUTDOWN_TIMEOUT" in messages[0], messages
    assert rs.dropped_points() == 10 * (KEYS + 1)


@contextmanager
def _slow_grpc_endpoint(port: int) -> Iterator[None]:
    """A real OTLP/gRPC server that takes each request and answers after 4 s (a sink still starting)."""
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc

    class Slow(metrics_service_pb2_grpc.MetricsServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 (the service's name)
            time.sleep(4.0)
            return metrics_service_pb2.ExportMetricsServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Slow(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        yield
    finally:
        server.stop(0)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_transport_tells_an_endpoint_that_took_the_request_and_did_not_answer_from_one_that_refused(
    protocol: str,
) -> None:
    """Real SDK exporters: an endpoint that takes the request and answers after the deadline (a real
    gRPC server; for HTTP, a socket that accepts and never answers) is slow; a port nothing listens
    on is refused at once (not slow)."""
    slow_port, closed_port = free_port(), free_port()
    slow_endpoint = _slow_grpc_endpoint if protocol == "grpc" else _silent_endpoint
    with slow_endpoint(slow_port):
        for port, slow in ((slow_port, True), (closed_port, False)):
            sender = make_sender(f"http://127.0.0.1:{port}", protocol)
            try:
                attempt = sender.send("metrics", b"", 2.0)  # room for a busy box to connect, or refuse
            finally:
                sender.shutdown()
            assert not attempt.sent and attempt.retry and attempt.slow is slow, attempt
