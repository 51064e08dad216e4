"""A shared sink that no client can take down (issue 40): a half-open flood, drops nobody reported,
a refusal flood in the log, and control-route bodies that lied.

Each case goes over real HTTP (and gRPC where the case concerns both transports) into a real
sink on loopback while an honest experiment (``tests.victim.Victim``) keeps finalizing: its
every step on time and exact, and the sink healthy with no internal error after (the
``make_sink`` fixture checks that at teardown)."""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import math
import resource
import select
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2 as lpb
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc as lgrpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as mpb
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as mgrpc
from opentelemetry.proto.common.v1 import common_pb2

from rankscope.backends.base import LoggerBackend, register_backend
from rankscope.core import names as attr
from rankscope.otlp.common import encode_resource, key_value
from rankscope.sink import Transport
from tests.victim import Victim, step_request

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PB = {"Content-Type": "application/x-protobuf", **AUTH}
GRPC_AUTH = (("authorization", f"Bearer {TOKEN}"),)


def ask(
    port: int, method: str, path: str, body: bytes | None = None, content_type: str = "application/json"
) -> tuple[int, bytes]:
    """One request on a fresh connection: (status, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        headers = {**AUTH, "Content-Type": content_type} if body is not None else AUTH
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def status_of(port: int, experiment: str | None = None) -> dict[str, Any]:
    code, body = ask(port, "GET", "/rankscope/v1/status" + (f"?experiment={experiment}" if experiment else ""))
    assert code == 200, body[:200]
    found: dict[str, Any] = json.loads(body)
    return found


def started(victim: Victim, steps: int = 3, within: float = 30.0) -> None:
    """Wait until the victim finalized ``steps`` steps."""
    deadline = time.monotonic() + within
    while len(victim.latencies) < steps and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(victim.latencies) >= steps, victim.errors[:3]


@contextlib.contextmanager
def descriptors(needed: int) -> Iterator[None]:
    """At least ``needed`` file descriptors for this process (the sink runs in it too), restored after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            pytest.skip(f"needs {needed} file descriptors, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def closed_by_peer(s: socket.socket, deadline: float) -> bool:
    """Whether the sink closes ``s`` before ``deadline`` (monotonic)."""
    try:
        while True:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            if not s.recv(4096):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def still_open(sockets: list[socket.socket]) -> int:
    """How many of ``sockets`` the sink has not closed: nothing to read on them (no EOF, no reset)."""
    poll = select.poll()
    for s in sockets:
        poll.register(s, select.POLLIN | select.POLLERR | select.POLLHUP)
    return len(sockets) - len(poll.poll(0))


FLOOD = 1024
HEADER_TIMEOUT = 5.0  # SinkConfig's default
HALF_A_HEAD = (
    f"POST /v1/metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: applica"
).encode()
HALF_A_PREFACE = b"PRI * HTTP/2.0\r\n"


H2_PREFACE_AND_SETTINGS = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
IDLE = 2.0


@pytest.mark.timeout(120)
def test_idle_http2_connections_are_closed_and_a_new_channel_is_served(make_sink) -> None:
    """Connections that finished the HTTP/2 handshake (preface, SETTINGS) and idled were never
    closed: at the gRPC connection cap every new channel got UNAVAILABLE. Now one that carries no
    call for ``idle_connection_timeout`` is closed (GOAWAY, then EOF), and a new channel is served
    after; the victim goes on exactly."""
    with descriptors(8192):
        sink = make_sink(transport=Transport(token=TOKEN, idle_connection_timeout=IDLE))
        flood: list[socket.socket] = []
        try:
            with Victim(sink.http_port, grpc_port=sink.grpc_port, token=TOKEN) as victim:
                started(victim)
                sent = time.monotonic()
                for _ in range(FLOOD):
                    s = socket.create_connection(("127.0.0.1", sink.grpc_port), timeout=10)
                    s.sendall(H2_PREFACE_AND_SETTINGS)
                    flood.append(s)
                deadline = sent + IDLE + HEADER_TIMEOUT + 3.0  # its idle time, after a handshake as slow as allowed
                assert all(closed_by_peer(s, deadline) for s in flood)
                closed = time.monotonic()
                with grpc.insecure_channel(f"127.0.0.1:{sink.grpc_port}") as channel:
                    answer = mgrpc.MetricsServiceStub(channel).Export(
                        step_request("legit", "r", 0, 0), metadata=GRPC_AUTH, timeout=30, wait_for_ready=True
                    )
                    assert answer.partial_success.rejected_data_points == 0
                time.sleep(1.0)
        finally:
            for s in flood:
                s.close()
        victim.check(min_steps=5, within=2.0)
        print(f"{FLOOD} idle HTTP/2 connections closed {closed - sent:.2f} s after they were opened")


@pytest.mark.timeout(120)
def test_a_half_open_flood_neither_locks_out_a_legitimate_client_nor_holds_its_connections(make_sink) -> None:
    """1,024 connections each holding half a request head (token set) filled ``max_connections``;
    a legitimate request then got ``ConnectionResetError``, and the flood held its connections for
    the idle timeout. A head must now arrive within ``header_timeout`` (5 s), and a newcomer at
    ``max_connections`` closes the connection that has waited longest for its head. gRPC
    connections that never finish their handshake are closed as fast; grpcio has no hook to make
    room, so a gRPC newcomer at its cap is refused (UNAVAILABLE, which OTLP clients retry) until
    then: it is served within the header deadline of the flood."""
    with descriptors(8192):
        sink = make_sink(transport=Transport(token=TOKEN))
        flood: list[socket.socket] = []
        grpc_flood: list[socket.socket] = []
        try:
            with Victim(sink.http_port, grpc_port=sink.grpc_port, token=TOKEN) as victim:
                started(victim)
                sent = time.monotonic()
                for _ in range(FLOOD):
                    s = socket.create_connection(("127.0.0.1", sink.http_port), timeout=10)
                    s.sendall(HALF_A_HEAD)
                    flood.append(s)
                for _ in range(FLOOD):
                    s = socket.create_connection(("127.0.0.1", sink.grpc_port), timeout=10)
                    s.sendall(HALF_A_PREFACE)
                    grpc_flood.append(s)
                flooded = time.monotonic()
                while still_open(flood) > FLOOD // 4 + 4 and time.monotonic() < flooded + 4.0:
                    time.sleep(0.05)  # the sink accepts them all, and holds this address's share
                held = still_open(flood)
                assert FLOOD // 4 - 4 <= held <= FLOOD // 4 + 4, held  # per_peer_connections: a quarter

                # a legitimate client, now, over both transports, on new connections
                legit = step_request("legit", "r", 0, 0).SerializeToString()
                code, body = ask(sink.http_port, "POST", "/v1/metrics", legit, "application/x-protobuf")
                assert code == 200, body[:200]
                assert still_open(flood) >= held - 4  # it made room by closing one that waited longest
                answered = time.monotonic()
                with grpc.insecure_channel(f"127.0.0.1:{sink.grpc_port}") as channel:  # retried, as OTLP clients do
                    answer = mgrpc.MetricsServiceStub(channel).Export(
                        step_request("legit", "r", 1, 0), metadata=GRPC_AUTH, timeout=30, wait_for_ready=True
                    )
                    assert answer.partial_success.rejected_data_points == 0
                grpc_answered = time.monotonic()
                assert grpc_answered < flooded + HEADER_TIMEOUT + 3.0

                # the flood's connections are closed within the header deadline of their sending
                deadline = flooded + HEADER_TIMEOUT + 3.0
                assert all(closed_by_peer(s, deadline) for s in flood)
                assert all(closed_by_peer(s, deadline) for s in grpc_flood)
                closed = time.monotonic()
                time.sleep(1.0)  # and the victim goes on after it
        finally:
            for s in flood + grpc_flood:
                s.close()
        victim.check(min_steps=5, within=2.0)
        print(
            f"flood held {held}/{FLOOD}; legit answered {answered - sent:.2f} s (gRPC {grpc_answered - sent:.2f} s), "
            f"flood closed {closed - sent:.2f} s"
        )
        print(f"victim: {len(victim.latencies)} steps, slowest {max(victim.latencies):.3f} s")
        assert sink.status("legit", "r")["points"] == 4
        assert sink.health() == (True, [])


# -- drops ---------------------------------------------------------------------------------------

GATE = threading.Event()
ENTERED = threading.Event()


class _SlowView(LoggerBackend):
    """A view whose log records wait for ``GATE`` (the first one sets ``ENTERED``)."""

    def init(self, *args: Any, **kwargs: Any) -> None:
        pass

    def log_batch(self, *args: Any, **kwargs: Any) -> None:
        pass

    def log_record(self, *args: Any, **kwargs: Any) -> None:
        ENTERED.set()
        GATE.wait(60)


register_backend("slow-test", _SlowView)


def logs_request(experiment: str, first: int, n: int) -> lpb.ExportLogsServiceRequest:
    """``n`` ordinary log records of one process, 500 to a step (``max_logs_per_step`` is 1,000)."""
    r = lpb.ExportLogsServiceRequest()
    rl = r.resource_logs.add(resource=encode_resource({attr.EXPERIMENT_ID: experiment, attr.SERVICE_INSTANCE_ID: "p1"}))
    records = rl.scope_logs.add().log_records
    now = time.time_ns()
    for i in range(first, first + n):
        record = records.add(
            time_unix_nano=now, severity_text="INFO", body=common_pb2.AnyValue(string_value=f"line {i}")
        )
        record.attributes.append(key_value(attr.STEP, i // 500))
    return r


@pytest.mark.timeout(120)
def test_what_a_slow_view_drops_is_counted_in_the_status_route_per_run_and_overall(make_sink) -> None:
    """6,000 log records to a view that does not keep up (its inbox holds 4,096): all were
    acknowledged, one log line said "dropping updates", and the status route had no count. Now
    every drop is counted by kind of data, per run and summed over the sink, and said at most
    once per 10 s in the log."""
    GATE.clear()
    ENTERED.clear()
    lines: list[logging.LogRecord] = []
    handler = _Collect(lines)
    logging.getLogger("rankscope.sink").addHandler(handler)
    sink = make_sink(
        backends={"slow": {"backend": "slow-test", "logging_mode": "global_reduce"}}, transport=Transport(token=TOKEN)
    )
    try:
        with Victim(sink.http_port, grpc_port=sink.grpc_port, token=TOKEN) as victim:
            started(victim)
            conn = http.client.HTTPConnection("127.0.0.1", sink.http_port, timeout=10)
            with grpc.insecure_channel(f"127.0.0.1:{sink.grpc_port}") as channel:
                stub = lgrpc.LogsServiceStub(channel)
                for i in range(60):  # 100 records a request, every other one over gRPC
                    request = logs_request("chatty", i * 100, 100)
                    if i % 2:
                        answer = stub.Export(request, metadata=GRPC_AUTH, timeout=10)
                    else:
                        conn.request("POST", "/v1/logs", body=request.SerializeToString(), headers=PB)
                        response = conn.getresponse()
                        assert response.status == 200
                        answer = lpb.ExportLogsServiceResponse.FromString(response.read())
                    assert answer.partial_success.rejected_log_records == 0, answer.partial_success.error_message
                    if i == 0:  # the view holds the first record: the inbox fills from here
                        assert ENTERED.wait(10)
            conn.close()
            run = status_of(sink.http_port, "chatty")
            overview = status_of(sink.http_port)
            GATE.set()
            time.sleep(0.5)
        victim.check(min_steps=5, within=2.0)
    finally:
        GATE.set()
        logging.getLogger("rankscope.sink").removeHandler(handler)
    dropped = 6000 - 1 - 4096  # one in the view's hands, 4,096 in its inbox
    assert run["log_records"] == 6000
    assert run["view_drops"] == {
        "step_views": 0,
        "late_updates": 0,
        "streamed_values": 0,
        "sample_rows": 0,
        "log_records": dropped,
        "anomaly_records": 0,
    }
    assert overview["view_drops"]["log_records"] == dropped and sum(overview["view_drops"].values()) == dropped
    assert status_of(sink.http_port, "victim")["view_drops"]["step_views"] == 0
    said = [r.getMessage() for r in lines if "dropped" in r.getMessage()]
    assert len(said) == 1 and f"{dropped} log_records in all" not in said[0], said  # said once, at the first
    assert "views of chatty are too slow: dropped 1 updates" in said[0]


class _Collect(logging.Handler):
    def __init__(self, into: list[logging.LogRecord]) -> None:
        super().__init__(logging.DEBUG)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record)


# -- the log -------------------------------------------------------------------------------------


def resuming(experiment: str, run: str, resume: str) -> mpb.ExportMetricsServiceRequest:
    """A launch ``run`` of ``experiment`` asking to resume ``resume``."""
    r = step_request(experiment, run, 0, 0)
    resource = r.resource_metrics[0].resource
    resource.attributes.append(key_value(attr.RUN_RESUME, resume))
    return r


@pytest.mark.timeout(120)
def test_a_flood_of_one_refusal_writes_a_bounded_log_and_leaves_the_other_notes(make_sink) -> None:
    """2,000 refused resumes wrote 2,000 WARNING lines in 0.4 s and pushed the 20 ``run_notes`` an
    operator would read out of the status route. Each kind of note is now logged at most once per
    10 s with the count of those not logged, and kept as one entry with its count. Requests aiohttp
    cannot parse wrote an ERROR with a traceback each; now one WARNING per kind per 10 s."""
    lines: list[logging.LogRecord] = []
    handler = _Collect(lines)
    logger = logging.getLogger("rankscope.sink")
    logger.addHandler(handler)
    sink = make_sink(transport=Transport(token=TOKEN))
    try:
        with Victim(sink.http_port, grpc_port=sink.grpc_port, token=TOKEN) as victim:
            started(victim)
            conn = http.client.HTTPConnection("127.0.0.1", sink.http_port, timeout=10)

            def export(r: mpb.ExportMetricsServiceRequest) -> mpb.ExportMetricsServiceResponse:
                conn.request("POST", "/v1/metrics", body=r.SerializeToString(), headers=PB)
                response = conn.getresponse()
                assert response.status == 200
                return mpb.ExportMetricsServiceResponse.FromString(response.read())

            # what an operator reads first: a resume that found nothing to continue (taken, as a new run)
            assert export(resuming("fresh", "launch-1", "latest")).partial_success.rejected_data_points == 0
            flood_began = time.monotonic()
            with grpc.insecure_channel(f"127.0.0.1:{sink.grpc_port}") as channel:
                stub = mgrpc.MetricsServiceStub(channel)
                for i in range(2000):  # a client resuming runs that do not exist, over both transports
                    r = resuming("victim", f"launch-{i}", f"no-such-run-{i}")
                    answer = stub.Export(r, metadata=GRPC_AUTH, timeout=10) if i % 2 else export(r)
                    assert answer.partial_success.rejected_data_points == 3  # two points and the flush marker
                    assert "has no run" in answer.partial_success.error_message
            conn.close()
            refusals_took = time.monotonic() - flood_began
            malformed_began = time.monotonic()
            for _ in range(500):  # and requests aiohttp cannot parse, each on its own connection
                with socket.create_connection(("127.0.0.1", sink.http_port), timeout=10) as s:
                    s.sendall(b"POST /v1/metrics HTTP/1.1\r\nBad Header\r\n\r\n")
                    assert s.recv(4096).split(b" ", 2)[1] == b"400"
            malformed_took = time.monotonic() - malformed_began
            overview = status_of(sink.http_port)
        victim.check(min_steps=5, within=2.0)
    finally:
        logger.removeHandler(handler)
    refused = [r for r in lines if "has no run 'no-such-run" in r.getMessage()]
    # once per 10 s of each flood (on a busy box the 2,000 refusals took 20 s and more), never once a request
    most_refused, most_malformed = 1 + math.ceil(refusals_took / 10), 1 + math.ceil(malformed_took / 10)
    assert 1 <= len(refused) <= most_refused, (len(refused), refusals_took)
    assert all(r.levelno == logging.WARNING for r in refused)
    malformed = [r for r in lines if r.name == "rankscope.sink.http"]
    assert 1 <= len(malformed) <= most_malformed, (len(malformed), malformed_took)
    assert all(r.levelno == logging.WARNING and not r.exc_info for r in malformed)
    assert "400, message: Invalid header token" in malformed[0].getMessage()
    others = [r for r in lines if r.levelno >= logging.WARNING and r not in refused and r not in malformed]
    assert len(others) <= 2, [r.getMessage()[:100] for r in lines]
    notes = overview["run_notes"]
    assert any("has no run to continue; run 'launch-1' is new" in note for note in notes), notes
    assert [note for note in notes if "no-such-run" in note] == [
        "resume: experiment 'victim' has no run 'no-such-run-1999' [2000 of this kind]"
    ]
    assert overview["refusals"]["experiment … has no run …"] == 2000 * 3


# -- the smaller items ---------------------------------------------------------------------------


def refused_with(port: int, path: str, body: bytes) -> str:
    """The reason a control route refuses ``body`` with 400."""
    code, answer = ask(port, "POST", path, body)
    assert code == 400, (code, answer[:300])
    reason = Status.FromString(answer).message if not answer.startswith(b"{") else json.loads(answer)["message"]
    assert isinstance(reason, str)
    return reason


@pytest.mark.timeout(120)
def test_lying_control_bodies_are_answered_400_with_a_reason_and_change_nothing(make_sink) -> None:
    """A config body nested 100,000 deep was answered 500 (``RecursionError``); capture requests that
    failed validation were answered 429, and ranks ``[-1, 2**70]`` were taken; the config route took
    experiment ids with NUL or of 10,000 characters that the OTLP edge refuses."""
    sink = make_sink(transport=Transport(token=TOKEN))
    port = sink.http_port
    with Victim(port, grpc_port=sink.grpc_port, token=TOKEN) as victim:
        started(victim)
        deep = b'{"experiment": "x", "backends": {"console": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}"
        assert "nested too deeply" in refused_with(port, "/rankscope/v1/config", deep)
        twenty = {"console": {"a": json.loads("[" * 20 + "]" * 20)}}
        body = json.dumps({"experiment": "x", "backends": twenty}).encode()
        assert "nest deeper than 16 levels" in refused_with(port, "/rankscope/v1/config", body)
        for experiment, why in (("bad\x00id", "'bad\\x00id' is empty"), ("x" * 10_000, "of 10000 characters")):
            body = json.dumps({"experiment": experiment, "backends": {}}).encode()
            assert why in refused_with(port, "/rankscope/v1/config", body)
            body = json.dumps({"experiment": experiment, "steps": 2}).encode()
            assert why in refused_with(port, "/rankscope/v1/captures", body)
            body = json.dumps({"experiment": experiment}).encode()
            assert why in refused_with(port, "/rankscope/v1/report", body)
        for capture, why in (
            ({"ranks": [-1, 2**70]}, "ranks must be in [0, 2147483648), got -1 to 1180591620717411303424"),
            ({"ranks": [0, 2**31]}, "ranks must be in [0, 2147483648)"),
            ({"ranks": list(range(16_385))}, "at most 16384 ranks"),
            ({"steps": 0}, "steps must be in [1, 64], got 0"),
            ({"steps": -5}, "steps must be in [1, 64], got -5"),
            ({"steps": 10**6}, "steps must be in [1, 64]"),
            ({"reason": {"not": "text"}}, "reason must be strings"),
        ):
            body = json.dumps({"experiment": "victim", **capture}).encode()
            assert why in refused_with(port, "/rankscope/v1/captures", body)
        assert "nested too deeply" in refused_with(port, "/rankscope/v1/captures", b"[" * 100_000)
        code, _ = ask(
            port, "POST", "/rankscope/v1/captures", json.dumps({"experiment": "victim", "ranks": [0]}).encode()
        )
        assert code == 200  # a good one is taken
        code, answer = ask(port, "POST", "/rankscope/v1/captures", json.dumps({"experiment": "victim"}).encode())
        assert code == 429 and b"less than 5s ago" in answer  # and a rate limit is still 429
        assert (
            ask(port, "POST", "/rankscope/v1/config", json.dumps({"experiment": "ok", "backends": {}}).encode())[0]
            == 200
        )
        time.sleep(0.5)
    victim.check(min_steps=5, within=2.0)
    assert ask(port, "GET", "/healthz")[0] == 200
    assert "x" * 10_000 not in sink.views.posted_backends and "bad\x00id" not in sink.views.posted_backends
    assert [c["ranks"] for c in sink.status("victim")["captures"]] == [[0]]


@pytest.mark.timeout(60)
def test_connections_closed_to_make_room_hold_no_descriptor_even_when_their_client_does_not_read() -> None:
    """Closing a connection waits for its unsent answer to drain: 20 clients that asked for an
    8 MB answer and never read it, each closed to make room for a newcomer, still held their
    sockets (and their handlers) after they were counted out: a leak an attacker repeats until
    the process is out of descriptors. A connection closed to make room is now aborted."""
    import asyncio

    from aiohttp import web

    from rankscope.sink.testing import ConnectionServer, Listener

    big = b"y" * (8 << 20)

    async def handle(request: web.BaseRequest) -> web.Response:
        return web.Response(body=big if request.path == "/big" else b"ok")

    loop = asyncio.new_event_loop()
    server = ConnectionServer(handle, loop=loop, max_connections=20, per_peer=20, header_timeout=5.0, access_log=None)
    runner = web.ServerRunner(server, handle_signals=False, access_log=None)
    loop.run_until_complete(runner.setup())
    listener = Listener(loop, server, "127.0.0.1", 0, backlog=128)
    listener.start()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    sockets: list[socket.socket] = []
    try:
        for _ in range(20):  # each asks for 8 MB and reads nothing
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", listener.port))
            s.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
            sockets.append(s)
        time.sleep(1.5)  # their answers are stuck: they count as slow readers now
        for _ in range(20):  # newcomers, each served, each making room
            s = socket.create_connection(("127.0.0.1", listener.port), timeout=10)
            s.sendall(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(1000).startswith(b"HTTP/1.1 200")
            sockets.append(s)
        deadline = time.monotonic() + 5
        while server.counts.closed["slow"] < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.counts.closed["slow"] == 20, server.counts.status()
        held = len([c for c in server.connections if c.transport is not None])
        assert held <= 20, held  # the newcomers only: the slow readers' sockets are gone
        assert all(closed_by_peer(s, time.monotonic() + 2) for s in sockets[:20])  # reset, not left open
    finally:
        for s in sockets:
            s.close()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        listener.close()
        loop.run_until_complete(runner.cleanup())
        loop.close()
