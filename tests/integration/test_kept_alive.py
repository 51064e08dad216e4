"""OTLP/HTTP on one kept-alive connection (``export.kept_alive``), against the real sink's HTTP edge
and, for what a sink never does, real sockets that misbehave on purpose."""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from rankscope.core import names as attr
from rankscope.export import _otel_sdk
from rankscope.export.kept_alive import MAX_ANSWER_BYTES, KeptAlive, NoAnswerError, takes
from rankscope.export.senders import make_sender
from rankscope.otlp.common import encode_resource
from rankscope.sink import Sink, Transport

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _no_proxy_or_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each test from a known environment: the developer's proxy variables, ``~/.netrc`` and credential
    providers would decide the transport otherwise."""
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    for name in _otel_sdk._CREDENTIAL_PROVIDERS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))


def _metrics(experiment: str, value: float) -> bytes:
    resource = encode_resource({attr.EXPERIMENT_ID: experiment, attr.ROLE: "trainer", attr.RANK: "0"})
    point = NumberDataPoint(as_double=value, time_unix_nano=time.time_ns())
    metric = Metric(name="loss")
    metric.gauge.data_points.append(point)
    scope = ScopeMetrics(metrics=[metric])
    return ExportMetricsServiceRequest(
        resource_metrics=[ResourceMetrics(resource=resource, scope_metrics=[scope])]
    ).SerializeToString()


def _spans(experiment: str) -> bytes:
    resource = encode_resource({attr.EXPERIMENT_ID: experiment, attr.ROLE: "trainer", attr.RANK: "0"})
    now = time.time_ns()
    span = Span(
        trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="step", start_time_unix_nano=now, end_time_unix_nano=now
    )
    scope = ScopeSpans(spans=[span])
    return ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(resource=resource, scope_spans=[scope])]
    ).SerializeToString()


def _wait(predicate: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_a_process_sends_every_signal_on_one_kept_alive_connection(make_sink: Callable[..., Sink]) -> None:
    """Metrics and spans, many rounds: one connection the whole time (the SDK's ``requests`` kept one a signal)."""
    sink = make_sink()
    sender = make_sender(f"http://127.0.0.1:{sink.http_port}", "http/protobuf")
    try:
        for i in range(20):
            assert sender.send("spans", _spans("kept-alive")).sent
            assert sender.send("metrics", _metrics("kept-alive", float(i))).sent
        assert sink.connections.open == 1, sink.connections.status()
    finally:
        sender.shutdown()
    assert _wait(lambda: sink.connections.open == 0)  # shutdown closes it


def test_a_connection_the_sink_closed_while_idle_is_opened_again_and_nothing_is_lost(
    make_sink: Callable[..., Sink],
) -> None:
    """The sink closes a connection idle past its timeout; the next request opens a new one and is taken once."""
    sink = make_sink(transport=Transport(idle_connection_timeout=0.3))
    sender = make_sender(f"http://127.0.0.1:{sink.http_port}", "http/protobuf")
    try:
        assert sender.send("metrics", _metrics("reopened", 1.0)).sent
        assert _wait(lambda: sink.connections.open == 0)  # the sink closed it
        for value in (2.0, 3.0):
            attempt = sender.send("metrics", _metrics("reopened", value))
            assert attempt.sent, attempt
        assert sink.connections.open <= 1  # one at a time (0 once the sink has closed this one too, on a slow box)
    finally:
        sender.shutdown()
    assert sink.overview()["foreign_points"] == 3  # each request's one point (not rankscope's: foreign), once


@contextmanager
def _answering(answer: Callable[[socket.socket], None]) -> Iterator[int]:
    """A listening socket whose every connection gets ``answer`` after its request head arrives (the
    client hanging up mid-answer ends it)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            held.append(conn)
            conn.settimeout(5)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            with contextlib.suppress(OSError):
                answer(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        server.close()


def test_an_answer_longer_than_an_otlp_answer_is_cut_and_its_connection_closed() -> None:
    """A hostile endpoint's endless body: the transport reads at most ``MAX_ANSWER_BYTES`` and hangs up."""
    length = 64 * MAX_ANSWER_BYTES

    def endless(conn: socket.socket) -> None:
        conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {length}\r\n\r\n".encode())
        with_zeros = b"\0" * 65536
        for _ in range(4 * MAX_ANSWER_BYTES // 65536):  # more than the cut, less than it says
            conn.sendall(with_zeros)

    with _answering(endless) as port:
        transport = KeptAlive()
        try:
            result = transport.request("POST", f"http://127.0.0.1:{port}/v1/metrics", data=b"x", timeout=10)
            assert result.status_code == 200 and len(result.content()) == MAX_ANSWER_BYTES
            assert not transport._connections[("127.0.0.1", port)].sock  # closed, not read on
        finally:
            transport.close()


def test_a_request_taken_and_never_answered_is_no_answer_not_a_refusal() -> None:
    """Sent, then silence past the deadline: ``NoAnswerError`` (slow, as gRPC's DEADLINE_EXCEEDED)."""
    with _answering(lambda conn: None) as port:
        transport = KeptAlive()
        try:
            result = transport.request("POST", f"http://127.0.0.1:{port}/v1/metrics", data=b"x" * 1000, timeout=2.0)
            assert isinstance(result.error, NoAnswerError), result
            assert not transport.is_connection_error(result.error)  # the SDK's client does not resend it at once
        finally:
            transport.close()


def sends_on_kept_alive(url: str) -> bool:
    """Whether an OTLP/HTTP sender to ``url`` swapped its metrics client's transport for its ``KeptAlive``."""
    sender = make_sender(url, "http/protobuf")
    try:
        client = sender._transports["metrics"]._exporter._client  # type: ignore[attr-defined]
        return client._transport is sender._kept_alive  # type: ignore[attr-defined,no-any-return]
    finally:
        sender.shutdown()


def test_a_plain_http_endpoint_shares_one_kept_alive_transport_and_https_keeps_the_sdks() -> None:
    """``http://``: every signal's SDK client sends through the sender's one ``KeptAlive``; ``https://``
    keeps the SDK's transport (its certificates and client keys come from the SDK's variables)."""
    plain, tls = (
        make_sender("http://127.0.0.1:4318", "http/protobuf"),
        make_sender("https://example.org", "http/protobuf"),
    )
    try:
        clients = [plain._make(signal)._exporter._client for signal in ("metrics", "spans", "logs")]  # type: ignore[attr-defined]
        assert all(client._transport is plain._kept_alive for client in clients)  # type: ignore[attr-defined]
        tls_client = tls._transports["metrics"]._exporter._client  # type: ignore[attr-defined]
        assert not isinstance(tls_client._transport, KeptAlive)
    finally:
        plain.shutdown()
        tls.shutdown()


def test_an_endpoint_behind_a_proxy_keeps_the_sdks_transport_and_loopback_is_never_proxied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``http_proxy`` sends a remote endpoint through the SDK's ``requests`` (which honours it, as
    before); ``no_proxy`` and the loopback interface (the embedded sink's) go on the kept-alive one."""
    monkeypatch.setenv("http_proxy", "http://proxy.invalid:3128")
    monkeypatch.setenv("no_proxy", "collector.direct")
    cases = {
        "http://collector.example:4318": False,
        "http://collector.direct:4318": True,
        "http://127.0.0.1:4318": True,
        "http://localhost:4318": True,
    }
    for url, kept in cases.items():
        assert sends_on_kept_alive(url) is kept, url


def test_a_trickled_answer_is_cut_at_the_deadline_not_per_read() -> None:
    """A server sending one header line every 0.2 s: ``http.client``'s timeout restarts at each read,
    the request's does not (it ends near its 1 s, as no answer)."""

    def trickle(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        for i in range(60):
            time.sleep(0.2)
            conn.sendall(f"X-Slow-{i}: 1\r\n".encode())

    with _answering(trickle) as port:
        transport = KeptAlive()
        try:
            started = time.monotonic()
            result = transport.request("POST", f"http://127.0.0.1:{port}/v1/metrics", data=b"x", timeout=1.0)
            took = time.monotonic() - started
            assert isinstance(result.error, NoAnswerError), result
            assert took < 3.0, took  # 12 s one read at a time
        finally:
            transport.close()


def test_close_returns_at_once_and_ends_a_request_in_flight() -> None:
    """Shutdown's escape from a stuck send: ``close`` does not wait for the request, which returns."""
    with _answering(lambda conn: None) as port:
        transport = KeptAlive()
        results: list[object] = []
        worker = threading.Thread(
            target=lambda: results.append(
                transport.request("POST", f"http://127.0.0.1:{port}/v1/metrics", data=b"x", timeout=30)
            )
        )
        worker.start()
        time.sleep(0.5)  # the request is waiting for its answer
        started = time.monotonic()
        transport.close()
        worker.join(5)
        assert not worker.is_alive() and time.monotonic() - started < 5
        assert results and results[0].error is not None  # type: ignore[attr-defined]
        later = transport.request("POST", f"http://127.0.0.1:{port}/v1/metrics", data=b"x", timeout=1)
        assert later.error is not None and not transport.is_connection_error(later.error)  # closed for good


def test_a_bad_header_or_url_is_an_answer_with_its_error_never_raised(make_sink: Callable[..., Sink]) -> None:
    sink = make_sink()
    transport = KeptAlive()
    try:
        url = f"http://127.0.0.1:{sink.http_port}/v1/metrics"
        bad = transport.request("POST", url, headers={"X-Name": "caf\u00e9\u2603"}, data=b"", timeout=5)
        assert bad.error is not None and bad.status_code is None
        assert transport.request("POST", "http://[::1/v1/metrics", data=b"", timeout=5).error is not None
        good = transport.request("POST", url, headers={"Content-Type": "application/x-protobuf"}, data=b"", timeout=5)
        assert good.status_code == 200, good  # the connection the bad header left half-used was not reused
    finally:
        transport.close()


@pytest.mark.parametrize(
    ("url", "env", "kept"),
    [
        ("http://user:secret@collector.example:4318", {}, False),  # requests sends them as Basic auth
        ("http://collector.example:4318", {"ALL_PROXY": "http://proxy.invalid:3128"}, False),
        ("http://127.evil.example:4318", {"http_proxy": "http://proxy.invalid:3128"}, False),  # a name, not loopback
        ("http://[::1]:4318", {"http_proxy": "http://proxy.invalid:3128"}, True),
        ("http://collector.example:4318", {}, True),
    ],
)
def test_an_endpoint_with_credentials_or_any_proxy_keeps_the_sdks_transport(
    url: str, env: dict[str, str], kept: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert sends_on_kept_alive(url) is kept


def test_a_netrc_entry_for_the_host_keeps_the_sdks_transport(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    netrc = tmp_path / "netrc"
    netrc.write_text("machine collector.example login user password secret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    for url, kept in (("http://collector.example:4318", False), ("http://other.example:4318", True)):
        assert sends_on_kept_alive(url) is kept, url


def test_a_session_of_the_users_own_keeps_the_sdks_transport() -> None:
    """A credential provider's session (``OTEL_PYTHON_EXPORTER_OTLP_HTTP_*CREDENTIAL_PROVIDER``), or one
    with auth, headers, proxies or an adapter of its own, signs or routes requests ``http.client`` would
    not: the swap is skipped; a session as the SDK makes one is swapped."""

    class Signed(requests.Session):
        pass

    with_auth, with_header, with_proxy, with_adapter = (requests.Session() for _ in range(4))
    with_auth.auth = ("user", "secret")
    with_header.headers["Authorization"] = "Bearer secret"
    with_proxy.proxies["http"] = "http://proxy.invalid:3128"
    with_adapter.mount("http://", type("Signing", (requests.adapters.HTTPAdapter,), {})())
    cases = [(Signed(), False), (with_auth, False), (with_header, False), (with_proxy, False)]
    for session, swapped in [*cases, (with_adapter, False), (requests.Session(), True)]:
        exporter = _otel_sdk.make_exporter(
            "http/protobuf",
            "metrics",
            endpoint="http://collector.example:4318/v1/metrics",
            session=session,  # type: ignore[arg-type]
        )
        try:
            assert _otel_sdk.keep_alive(exporter, KeptAlive(), takes) is swapped
        finally:
            exporter.shutdown()


def test_a_credential_provider_named_in_the_sdks_variables_keeps_the_sdks_transport(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever session the provider makes, its requests are the SDK's to send."""
    assert sends_on_kept_alive("http://collector.example:4318")
    monkeypatch.setenv("OTEL_PYTHON_EXPORTER_OTLP_HTTP_METRICS_CREDENTIAL_PROVIDER", "some_package:credentials")
    monkeypatch.setattr(
        "opentelemetry.exporter.otlp.proto.http.metric_exporter._load_session_from_envvar", lambda name: None
    )  # the provider's package is not installed here: the SDK would make its own session, as without one
    assert not sends_on_kept_alive("http://collector.example:4318")


def test_a_host_http_client_would_refuse_keeps_the_sdks_transport_and_a_request_to_it_never_raises() -> None:
    for url in ("http://collector example:4318", "http://collector\x01example:4318", "http://[::1:4318"):
        assert not takes(url), url
    transport = KeptAlive()
    try:
        result = transport.request("POST", "http://collector example:4318/v1/metrics", data=b"x", timeout=1)
        assert isinstance(result.error, http.client.InvalidURL), result
    finally:
        transport.close()


def test_close_does_not_wait_for_a_request_still_connecting_which_ends_as_its_connect_returns() -> None:
    """A listener whose accept queue is full drops the next SYN: that connect waits (as a DNS lookup
    that hangs does), with no socket ``close`` could shut down. ``close`` returns at once; once the
    queue has room the kernel's next SYN gets through, and the request ends there, not at its deadline,
    closing its connection."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    fillers: list[socket.socket] = []
    try:
        for _ in range(8):  # fill the queue: connects that return at once while it has room
            filler = socket.socket()
            filler.settimeout(0.2)
            try:
                filler.connect(("127.0.0.1", port))
            except TimeoutError:
                filler.close()
                break
            fillers.append(filler)
        else:
            pytest.skip("this kernel kept accepting connections into a full queue")
        transport = KeptAlive()
        results: list[object] = []
        url = f"http://127.0.0.1:{port}/v1/metrics"
        started = time.monotonic()
        worker = threading.Thread(target=lambda: results.append(transport.request("POST", url, data=b"x", timeout=20)))
        worker.start()
        time.sleep(0.3)  # the request is connecting
        closing = time.monotonic()
        transport.close()
        assert time.monotonic() - closing < 1.0  # the lock the request holds is not waited for
        with contextlib.suppress(TimeoutError):
            while True:  # room in the queue: the connect's next SYN (about 1 s after its first) is taken
                fillers.append(server.accept()[0])
        worker.join(15)
        assert not worker.is_alive() and results, "the request did not end"
        assert isinstance(results[0].error, ConnectionAbortedError), results  # type: ignore[attr-defined]
        assert time.monotonic() - started < 15  # ended as its connect returned, not at its 20 s deadline
        assert not transport._connections  # closed by the request as it ended
    finally:
        for filler in fillers:
            filler.close()
        server.close()
