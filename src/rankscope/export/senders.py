"""Where a process's OTLP goes: the SDK's own exporters, fed with serialized requests.

rankscope encodes its OTLP requests itself (its states are already aggregated; metric requests
from per-key templates, ``otlp.templates``), then hands the bytes to the SDK exporter's
transport, so endpoint, headers, TLS, compression and timeouts follow the SDK and its
``OTEL_EXPORTER_OTLP_*`` variables, except that a plain ``http://`` endpoint's requests go through one
kept-alive ``http.client`` connection (``kept_alive``: about half the CPU of the SDK's ``requests``
or of gRPC). Every sender (gRPC, HTTP, the embedded sink's, a forked child's relay) is a ``Sender``:
bytes in, one ``Attempt`` out. The embedded sink is sent to over OTLP/HTTP (its HTTP port).

Each ``send`` is **one attempt**, never the SDK's retry loop: the SDK exporters retry with
exponential backoff inside ``export()`` for up to ``OTEL_EXPORTER_OTLP_TIMEOUT`` and then
drop the batch, which made an endpoint outage lose every step while the export thread sat
in the SDK's sleep. Here an attempt has one deadline (the exporter's timeout, or less at
shutdown) and answers ``Attempt``: sent, *retry* (unreachable, overloaded, timed out: the
export thread keeps the steps in its bounded queue and retries with its own backoff) or
rejected (the endpoint refused the request for good: counted as dropped). gRPC channels
reconnect within ``_MAX_RECONNECT_BACKOFF_MS`` of an endpoint coming back (gRPC's own
default backoff grows to two minutes).

The exporters' transports are private names of the SDK: ``_otel_sdk`` holds and checks them,
and a sender whose exporter lacks them refuses every send with a message that names the package,
its version and the missing name (reported once, at init).

Metrics go as metrics; streamed raw values (``per_rank_no_reduce`` views in the sink) go
as OTLP log records. ``EmbeddedSender`` finds or starts the experiment's embedded sink the
first time it has something to send, on the export thread, never on the caller's.

Forked children never touch gRPC: a child that uses the gRPC core it inherited crashed now and
then in our stress test (SIGSEGV in 2 of 160 forks: a thread of the parent was in a call at the
moment of the fork). ``RelaySender`` in the child hands each request to the parent over a Unix
``SOCK_SEQPACKET`` socket pair made at fork; ``ForkRelay`` in the parent reads every child's
socket on one thread and gives the requests to the parent's export thread, which sends them with
its own bounded, retried queue. The same pair carries the parent's "flush now" at its shutdown.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import socket
import struct
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

# gRPC's fork handlers restart its threads in every forked child, and in our stress test (a parent
# recording, flushing and exporting on two threads while it forks 16 children per run) those
# threads killed children now and then: 4 of 128 children that only slept 1 s, and 2 to 7 of 160
# that recorded, died of SIGSEGV or SIGABRT ("Check failed: next_worker->state == KICKED"); with
# the handlers off, 0 of 640. Forked children never use gRPC here (they relay through the
# parent), so the handlers are off by default, set before grpc is first imported. A program that
# uses gRPC in forked children itself sets the variable (or imports grpc first).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from ..core.errors import report_internal_error
from . import _otel_sdk
from .kept_alive import KeptAlive, NoAnswerError, takes

_RETRYABLE_HTTP = frozenset({408, 429, 502, 503, 504})
_MAX_RECONNECT_BACKOFF_MS = 1000
_CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", _MAX_RECONNECT_BACKOFF_MS),
)


@dataclass(frozen=True, slots=True)
class Attempt:
    """The outcome of one send: ``sent``; else ``retry`` says whether trying again may work."""

    sent: bool
    retry: bool = False
    detail: str = ""
    retry_after: float | None = None
    """The endpoint's own hint (gRPC RetryInfo, HTTP Retry-After), seconds."""
    rejected: int = 0
    """Of a request that was taken, the items the endpoint refused (OTLP ``partial_success``; ``detail`` its reason)."""
    slow: bool = False
    """The endpoint took the request and did not answer within the deadline: busy, perhaps, not away."""


SENT = Attempt(True)

_RESPONSES: dict[str, tuple[Any, str]] = {
    "metrics": (metrics_service_pb2.ExportMetricsServiceResponse, "rejected_data_points"),
    "spans": (trace_service_pb2.ExportTraceServiceResponse, "rejected_spans"),
    "logs": (logs_service_pb2.ExportLogsServiceResponse, "rejected_log_records"),
}


def taken(signal: Signal, body: bytes | None) -> Attempt:
    """A taken request's answer: ``SENT``, or what its ``partial_success`` refused (an endpoint's
    answer that does not parse is taken as it was sent: the request was)."""
    if not body:
        return SENT
    response_class, field_name = _RESPONSES[signal]
    try:
        partial = response_class.FromString(body).partial_success
    except Exception:
        return SENT
    rejected = int(getattr(partial, field_name))
    if rejected <= 0:
        return SENT
    # The endpoint's words reach a terminal: printable characters only (no escape sequences).
    said = "".join(c if c.isprintable() else " " for c in partial.error_message[:1000])
    reason = " ".join(said.split())[:300] or "no reason given"
    return Attempt(True, detail=reason, rejected=rejected)


Signal = Literal["metrics", "spans", "logs"]


class Sender(Protocol):
    """Where a process's serialized OTLP requests go: one attempt per ``send``, never a retry loop.

    Implemented by ``GrpcSender`` and ``HttpSender`` (the SDK exporters' transports),
    ``EmbeddedSender`` (the experiment's embedded sink, found or started on first use) and
    ``RelaySender`` (a forked child's: through its parent process)."""

    @property
    def target(self) -> str:
        """Where the requests go, in words (for log lines)."""
        ...

    def send(self, signal: Signal, payload: bytes, timeout: float | None = None) -> Attempt: ...

    def shutdown(self, timeout_millis: float = 30_000) -> None: ...


class _Transport(Protocol):
    """One signal's way to the endpoint (an SDK exporter's channel or HTTP client)."""

    def send(self, payload: bytes, timeout: float | None = None) -> Attempt: ...

    def shutdown(self, **kwargs: Any) -> None: ...


class _GrpcTransport:
    """One ``Export`` call with one deadline on an SDK gRPC exporter's channel, with its headers."""

    def __init__(self, exporter: Any, signal: Signal) -> None:
        self._exporter = exporter
        self._signal = signal

    def send(self, payload: bytes, timeout: float | None = None) -> Attempt:
        try:
            answer = _otel_sdk.grpc_export(self._exporter, self._signal, payload, timeout)
            if answer is None:
                return Attempt(False, detail="the exporter is shut down")
            return taken(self._signal, answer)
        except grpc.RpcError as error:
            code = error.code()
            detail = f"{getattr(code, 'name', code)}: {error.details()}"
            retry = code in _otel_sdk.grpc_retryable(self._exporter)
            slow = code == grpc.StatusCode.DEADLINE_EXCEEDED
            return Attempt(False, retry=retry, detail=detail, retry_after=_hint(error), slow=slow)

    def shutdown(self, **kwargs: Any) -> None:
        self._exporter.shutdown(**kwargs)


def _hint(error: Any) -> float | None:
    try:
        raw = dict(error.trailing_metadata() or ()).get("google.rpc.retryinfo-bin")
        if raw is None:
            return None
        from google.rpc.error_details_pb2 import RetryInfo

        info = RetryInfo()
        info.ParseFromString(raw)
        return float(info.retry_delay.seconds + info.retry_delay.nanos / 1e9)
    except Exception:
        return None


class _HttpTransport:
    """One POST with one deadline through an SDK HTTP exporter's client (its retry loop unused)."""

    def __init__(self, exporter: Any, signal: Signal) -> None:
        self._exporter = exporter
        self._signal = signal

    def send(self, payload: bytes, timeout: float | None = None) -> Attempt:
        result = _otel_sdk.http_post(self._exporter, payload, timeout)
        if result is None:
            return Attempt(False, detail="the exporter is shut down")
        status = result.status_code
        if status is not None and 200 <= status < 300:
            try:
                body = result.content()
            except Exception:
                body = None
            return taken(self._signal, body)
        if status is None:  # no answer: refused connection, timeout, DNS
            # connected and sent, no answer in time (kept_alive's, or requests')
            slow = isinstance(result.error, NoAnswerError) or type(result.error).__name__ == "ReadTimeout"
            return Attempt(False, retry=True, detail=f"{result.error or result.reason}", slow=slow)
        after = None
        try:
            header = result.headers().get("retry-after")
            after = float(header) if header is not None else None
        except Exception:
            after = None
        return Attempt(
            False, retry=status in _RETRYABLE_HTTP, detail=f"HTTP {status} {result.reason}", retry_after=after
        )

    def shutdown(self, **kwargs: Any) -> None:
        self._exporter.shutdown(**kwargs)


class _Refused:
    """A transport whose SDK exporter lacks a private name rankscope needs: every send is refused, saying so."""

    def __init__(self, why: str) -> None:
        self._attempt = Attempt(False, detail=why)

    def send(self, payload: bytes, timeout: float | None = None) -> Attempt:
        return self._attempt

    def shutdown(self, **kwargs: Any) -> None:
        pass


def _transport(
    protocol: _otel_sdk.Protocol, signal: Signal, kept_alive: KeptAlive | None = None, **kwargs: Any
) -> _Transport:
    try:
        exporter = _otel_sdk.make_exporter(protocol, signal, **kwargs)
    except _otel_sdk.OtelSdkMismatchError as exc:
        report_internal_error(f"OTLP {signal} export over {protocol}", exc)
        return _Refused(str(exc))
    if kept_alive is not None:
        _otel_sdk.keep_alive(exporter, kept_alive, takes)
    return _GrpcTransport(exporter, signal) if protocol == "grpc" else _HttpTransport(exporter, signal)


def _url(endpoint: str | None) -> str | None:
    if endpoint is not None and "://" not in endpoint:
        return f"http://{endpoint}"  # a bare host:port means plaintext; say https:// for TLS
    return endpoint


def is_sink_http_port(endpoint: str | None, control: str) -> bool:
    """Whether ``endpoint`` names the sink's control port (``RANKSCOPE_SINK_CONTROL``), as ``rankscope
    run`` sets both: a port that takes OTLP/HTTP only, so it is sent that whatever the protocol setting.
    Plain ``http://`` only (a bare ``host:port`` is plaintext too), the host compared case-blind, the
    port with its default; no lookup (``localhost`` is not ``127.0.0.1``)."""
    if endpoint is None:
        return False
    try:
        a, b = urllib.parse.urlsplit(_url(endpoint) or ""), urllib.parse.urlsplit(control)
        return (
            a.scheme.lower() == b.scheme.lower() == "http"
            and bool(a.hostname)
            and a.hostname == b.hostname  # ``hostname`` is lower-cased
            and (a.port or 80) == (b.port or 80)
            and a.path.strip("/") == b.path.strip("/") == ""
        )
    except ValueError:  # a malformed control URL: nothing to match
        return False


def has_endpoint(endpoint: str | None) -> bool:
    return endpoint is not None or bool(
        os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


class _OtlpSender:
    """An OTLP endpoint over the SDK exporters: a transport per signal, the metrics' made at once (so a
    private-name mismatch is reported at ``init``), the others on first use (most processes of a
    metrics-only job never trace, and few stream)."""

    def __init__(self, endpoint: str | None) -> None:
        _otel_sdk.report_problems()
        self._url = _url(endpoint)
        self._transports: dict[Signal, _Transport] = {}
        self._transports["metrics"] = self._make("metrics")

    def _make(self, signal: Signal) -> _Transport:
        raise NotImplementedError

    @property
    def target(self) -> str:
        return str(
            self._url
            or os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
            or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "the OTLP endpoint")
        )

    def send(self, signal: Signal, payload: bytes, timeout: float | None = None) -> Attempt:
        transport = self._transports.get(signal)
        if transport is None:
            transport = self._transports[signal] = self._make(signal)
        return transport.send(payload, timeout)

    def shutdown(self, timeout_millis: float = 30_000) -> None:
        for signal, transport in list(self._transports.items()):  # the export thread may still add one
            if signal == "metrics":
                transport.shutdown(timeout_millis=timeout_millis)
            else:
                transport.shutdown()


class GrpcSender(_OtlpSender):
    """OTLP/gRPC: every signal on the endpoint's address."""

    def _make(self, signal: Signal) -> _Transport:
        return _transport("grpc", signal, endpoint=self._url, channel_options=_CHANNEL_OPTIONS)


class HttpSender(_OtlpSender):
    """OTLP/HTTP (protobuf): ``/v1/metrics``, ``/v1/traces``, ``/v1/logs`` under the endpoint's base,
    to a plain ``http://`` endpoint on one kept-alive connection the signals share (``kept_alive``)."""

    _PATHS: ClassVar[dict[Signal, str]] = {"metrics": "/v1/metrics", "spans": "/v1/traces", "logs": "/v1/logs"}

    def __init__(self, endpoint: str | None) -> None:
        self._kept_alive = KeptAlive()
        super().__init__(endpoint)

    def _make(self, signal: Signal) -> _Transport:
        base = None if self._url is None else self._url.rstrip("/").removesuffix("/v1/metrics")
        endpoint = None if base is None else base + self._PATHS[signal]
        return _transport("http/protobuf", signal, self._kept_alive, endpoint=endpoint)

    def shutdown(self, timeout_millis: float = 30_000) -> None:
        super().shutdown(timeout_millis)
        self._kept_alive.close()


def make_sender(endpoint: str | None, protocol: str) -> GrpcSender | HttpSender:
    """The sender for an OTLP endpoint (None: the ``OTEL_EXPORTER_OTLP_*`` variables say where)."""
    return HttpSender(endpoint) if protocol == "http/protobuf" else GrpcSender(endpoint)


class EmbeddedSender:
    """A sink this job owns (the experiment's embedded sink, or ``rankscope run``'s), found or
    started by ``connect``: as the export thread starts after an explicit ``init`` (the sink's
    start, seconds on a busy box, overlaps the job's setup instead of holding back its first steps'
    lines), else at the first send; a shutdown waits while it starts, and keeps retrying what it
    did not take in time while it is ``alive`` (``ExportThread.shutdown``)."""

    def __init__(self, connect: Callable[[], tuple[str, str]], protocol: str) -> None:
        _otel_sdk.report_problems()
        self._connect = connect
        self._protocol = protocol
        self._inner: GrpcSender | HttpSender | None = None
        self._failed = False
        self.control_url: str | None = None
        self.connecting = False
        """True while ``connect`` finds or starts the sink (bounded by the sink's start timeout)."""
        self.ready_at: float | None = None
        """When (``time.monotonic``) the sink was found or started: a shutdown's drain counts from here."""
        self._unsaid: Exception | None = None
        """Why ``connect`` failed, raised by the first send (the endpoint says it, and counts the drop)."""

    @property
    def target(self) -> str:
        return self._inner.target if self._inner is not None else "the experiment's sink"

    def connect(self) -> None:
        """Find or start the sink, once; a failure is kept for the first send to raise."""
        if self._inner is not None or self._failed:
            return
        self.connecting = True
        try:
            endpoint, self.control_url = self._connect()
        except Exception as exc:
            self._failed, self._unsaid = True, exc  # counted as dropped by the caller; the job goes on
            return
        finally:
            self.connecting = False
        self._inner = make_sender(endpoint or None, self._protocol)
        self.ready_at = time.monotonic()

    def send(self, signal: Signal, payload: bytes, timeout: float | None = None) -> Attempt:
        self.connect()
        if self._inner is None:
            unsaid, self._unsaid = self._unsaid, None
            if unsaid is not None:
                raise unsaid
            return Attempt(False, detail="no sink")
        return self._inner.send(signal, payload, timeout)

    @property
    def failed(self) -> bool:
        """Whether the sink could not be found or started (nothing will reach it)."""
        return self._failed

    def alive(self) -> bool:
        """Whether the sink still runs: its HTTP port takes a connection (a sink too busy to answer in
        time is alive; a refused connection, or no sink found, is not)."""
        return self.control_url is not None and port_open(self.control_url)

    def shutdown(self, timeout_millis: float = 30_000) -> None:
        if self._inner is not None:
            self._inner.shutdown(timeout_millis)


def port_open(url: str, timeout: float = 1.0) -> bool:
    """Whether ``url``'s host and port take a TCP connection within ``timeout`` (a listener whose
    backlog is full, or a timeout, counts as open: busy, not gone)."""
    parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return False
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", port), timeout=timeout):
            return True
    except TimeoutError:
        return True
    except OSError:
        return False


_FRAGMENT = 32 * 1024
_HEADER = struct.Struct("!IIHHc")  # sender pid, message id, fragment index, fragment count, kind
METRICS, SPANS, LOGS = b"m", b"s", b"l"
KINDS: dict[Signal, bytes] = {"metrics": METRICS, "spans": SPANS, "logs": LOGS}
SIGNALS: dict[bytes, Signal] = {kind: signal for signal, kind in KINDS.items()}
_HELLO, _ACK, _FLUSH = b"h", b"a", b"f"  # child: "I export through you", "flushed"; parent: "flush now"


def fork_pair() -> tuple[socket.socket, socket.socket]:
    """(parent end, child end) for one fork; raises OSError where SOCK_SEQPACKET is missing."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


class RelaySender:
    """A forked child's sender: requests go to the parent process, which exports them.

    ``listen(on_flush)`` says hello to the parent and answers its "flush now" (sent when the
    parent shuts down while this child still runs, e.g. persistent DataLoader workers): the
    child exports what it holds, then ``ack`` tells the parent it is all there.
    """

    def __init__(self, sock: socket.socket, parent_pid: int) -> None:
        self._sock = sock
        self._parent_pid = parent_pid
        self.target = f"the parent process (pid {parent_pid})"
        self._message = 0
        self._send_lock = threading.Lock()

    def _post(self, kind: bytes, data: bytes, timeout: float | None) -> Attempt:
        count = max(1, -(-len(data) // _FRAGMENT))
        if count > 0xFFFF:
            return Attempt(False, detail=f"a request of {len(data)} bytes is too large to relay")
        pid = os.getpid()
        try:
            with self._send_lock:
                self._message = (self._message + 1) & 0xFFFFFFFF
                self._sock.settimeout(5.0 if timeout is None else max(0.001, min(timeout, 5.0)))
                for i in range(count):
                    chunk = data[i * _FRAGMENT : (i + 1) * _FRAGMENT]
                    self._sock.send(_HEADER.pack(pid, self._message, i, count, kind) + chunk)
        except TimeoutError:
            return Attempt(False, retry=True, detail=f"{self.target} does not read")
        except OSError as exc:
            return Attempt(False, detail=f"{self.target} is gone ({exc})")
        return SENT

    def send(self, signal: Signal, payload: bytes, timeout: float | None = None) -> Attempt:
        return self._post(KINDS[signal], payload, timeout)

    def ack(self) -> None:
        self._post(_ACK, b"", 1.0)

    def listen(self, on_flush: Callable[[], None]) -> None:
        """Say hello, then call ``on_flush`` whenever the parent asks (a daemon thread)."""
        self._post(_HELLO, b"", 1.0)
        listener = self._sock.dup()  # its own timeout; the same socket
        listener.settimeout(1.0)

        def run() -> None:
            while True:
                try:
                    record = listener.recv(_HEADER.size + 16)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not record:
                    return  # the parent is gone
                if record[_HEADER.size - 1 : _HEADER.size] == _FLUSH:
                    on_flush()

        threading.Thread(target=run, name="rankscope-relay-listener", daemon=True).start()

    def for_child(self) -> RelaySender:
        """A grandchild shares the socket: each message is one atomic record, tagged with its pid."""
        return RelaySender(self._sock, self._parent_pid)

    def shutdown(self, timeout_millis: float = 30_000) -> None:
        pass  # the socket stays open for grandchildren; the process's exit closes it


class ForkRelay:
    """The parent's end of its forked children's exports: one thread reads every child's socket.

    ``adopt`` takes the parent end of a new pair (after fork, in the parent); a child's exit
    closes its end, which closes ours. ``deliver(kind, payload)`` runs on the relay thread and
    must not block (it queues the request for the export thread). ``flush_children`` asks every
    child that exports through us to send what it holds, and waits (bounded) for their answers.
    """

    def __init__(self, deliver: Callable[[bytes, bytes], None]) -> None:
        self._deliver = deliver
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._lock = threading.Condition()
        self._adopted: list[socket.socket] = []
        self._open: set[socket.socket] = set()
        self._exporting: set[socket.socket] = set()  # children that said hello
        self._awaiting: set[socket.socket] = set()
        self._drains = [0, 0]
        """Drains asked (``flush_children``) and done: every socket read until none has more."""
        self._partial: dict[tuple[int, int], list[bytes | None]] = {}
        self._thread = threading.Thread(target=self._run, name="rankscope-fork-relay", daemon=True)
        self._thread.start()

    def adopt(self, sock: socket.socket) -> None:
        with self._lock:
            self._adopted.append(sock)
        with contextlib.suppress(BlockingIOError):  # already woken
            os.write(self._wake_w, b"x")

    def flush_children(self, timeout: float) -> int:
        """Ask the live children that export through us to flush, and read what every child sent
        before (one that exited has its last export in its socket, maybe not read yet); returns
        how many did not answer in time."""
        with self._lock:
            asked = set()
            for sock in self._exporting:
                with contextlib.suppress(OSError):
                    sock.send(_HEADER.pack(os.getpid(), 0, 0, 1, _FLUSH))
                    asked.add(sock)
            self._awaiting = asked
            self._drains[0] += 1
            drain = self._drains[0]
        with contextlib.suppress(BlockingIOError):  # already woken
            os.write(self._wake_w, b"x")
        with self._lock:
            self._lock.wait_for(lambda: not self._awaiting and self._drains[1] >= drain, timeout)
            late, self._awaiting = len(self._awaiting), set()
        return late

    def close_in_child(self) -> None:
        """A child does not serve its siblings: close our copies of their sockets (no locks: one thread)."""
        for sock in [*self._open, *self._adopted]:
            with contextlib.suppress(OSError):
                sock.close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(Exception):
            self._selector.close()

    def _run(self) -> None:
        while True:
            self._serve(self._selector.select())
            with self._lock:
                asked = self._drains[0]
            if asked > self._drains[1]:  # read every socket until none has more, then say so
                while self._serve(self._selector.select(timeout=0)):
                    pass
                with self._lock:
                    self._drains[1] = asked
                    self._lock.notify_all()

    def _serve(self, ready: list[tuple[selectors.SelectorKey, int]]) -> bool:
        """Handle one round of ready sockets; whether any child's socket was among them."""
        read = False
        for key, _ in ready:
            if key.fd == self._wake_r:
                self._take_adopted()
                continue
            read = True
            sock: socket.socket = key.fileobj  # type: ignore[assignment]
            try:
                data = sock.recv(_HEADER.size + _FRAGMENT)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:  # the child exited
                self._selector.unregister(sock)
                sock.close()
                with self._lock:
                    self._open.discard(sock)
                    self._exporting.discard(sock)
                    self._answered(sock)
                continue
            with contextlib.suppress(Exception):  # a malformed record from a child: skip it
                self._record(sock, data)
        return read

    def _answered(self, sock: socket.socket) -> None:
        if sock in self._awaiting:
            self._awaiting.discard(sock)
            self._lock.notify_all()

    def _take_adopted(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 512):
                pass
        with self._lock:
            adopted, self._adopted = self._adopted, []
            for sock in adopted:
                sock.setblocking(False)
                self._selector.register(sock, selectors.EVENT_READ)
                self._open.add(sock)

    def _record(self, sock: socket.socket, data: bytes) -> None:
        pid, message, index, count, kind = _HEADER.unpack_from(data)
        payload = data[_HEADER.size :]
        if kind in (_HELLO, _ACK):
            with self._lock:
                self._exporting.add(sock)
                if kind == _ACK:
                    self._answered(sock)
            return
        if count == 1:
            self._deliver(kind, payload)
            return
        parts = self._partial.setdefault((pid, message), [None] * count)
        if len(parts) != count or index >= count:
            del self._partial[(pid, message)]
            return
        parts[index] = payload
        if all(p is not None for p in parts):
            del self._partial[(pid, message)]
            self._deliver(kind, b"".join(p for p in parts if p is not None))
        while len(self._partial) > 256:  # a child died mid-message: forget its oldest pieces
            del self._partial[next(iter(self._partial))]


def sink_status(
    control_url: str, experiment: str, timeout: float = 2.0, run: str | None = None
) -> dict[str, Any] | None:
    query = {"experiment": experiment, **({"run": run} if run else {})}
    url = f"{control_url.rstrip('/')}/rankscope/v1/status?{urllib.parse.urlencode(query)}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            found = json.loads(response.read())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def post_config(control_url: str, experiment: str, backends: Mapping[str, Any], timeout: float = 5.0) -> str:
    """Tell a rankscope sink which views this experiment wants (the first config wins)."""
    body = json.dumps({"experiment": experiment, "backends": backends}).encode()
    request = urllib.request.Request(
        control_url.rstrip("/") + "/rankscope/v1/config",
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return str(json.loads(response.read()).get("result"))


def request_report(control_url: str, experiment: str, timeout: float = 75.0, run: str | None = None) -> list[str]:
    """Ask a rankscope sink to write a run's report page now (None: the experiment's latest run); where it wrote.

    The sink waits up to 60 s for the experiment's views; while another request for the same
    page is being answered (429), this one asks again until ``timeout``. Raises ``RuntimeError``
    with the sink's reason (no report view, no such experiment) or ``OSError`` when the sink
    cannot be reached."""
    deadline = time.monotonic() + timeout
    while True:
        request = urllib.request.Request(
            control_url.rstrip("/") + "/rankscope/v1/report",
            data=json.dumps({"experiment": experiment, **({"run": run} if run else {})}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        token = os.environ.get("RANKSCOPE_SINK_TOKEN")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=max(1.0, deadline - time.monotonic())) as response:
                return [str(p) for p in json.loads(response.read()).get("reports", [])]
        except urllib.error.HTTPError as exc:
            try:
                reason = json.loads(exc.read()).get("message", "")
            except ValueError:
                reason = ""
            wait = float(exc.headers.get("Retry-After") or 2)
            if exc.code == 429 and time.monotonic() + wait < deadline:
                time.sleep(wait)
                continue
            raise RuntimeError(f"the sink answered {exc.code}: {reason or exc.reason}") from None
