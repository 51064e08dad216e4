"""OTLP/HTTP on one kept-alive connection: the SDK HTTP exporters' transport for a plain ``http://`` endpoint.

The SDK's default transport is ``requests``: a POST costs the export thread ~1.6 ms of CPU after
the pause between export rounds, urllib3's ~1.0 ms, ``http.client`` on a kept-alive connection
~0.6 ms, and gRPC ~1.3 ms with its own threads' (a 60 kB request to a null server in another
process, 0.3 s apart, this process's CPU on every thread; the 2-core VM, 2026-12-02). At two
requests a round that is the largest part of what the export thread pays that is not Python of
ours. So a process sends its HTTP signals through ``http.client``: one connection per endpoint,
shared by the signals (the export thread sends them one after another), opened again when the
server has closed it while it idled (the sink closes an idle one after 15 s). ``https://`` keeps
the SDK's transport: its certificates and client keys come from the SDK's variables; so does an
endpoint that the ``http_proxy`` / ``no_proxy`` variables send through a proxy (``takes``), as
``requests`` would, except on the loopback interface (the embedded sink's), never proxied, and one
with credentials ``requests`` would send (the URL's, ``.netrc``'s, a session's: ``_otel_sdk.keep_alive``).

What a transport must answer is the SDK's (``BaseHTTPTransport``): a status and body, or the error
that stopped the request; the SDK's client retries a connection error once at once (a connection
the server closed as it was reused). An answer not read in time is ``NoAnswerError``: the endpoint
took the request and is slow, not gone (``senders`` backs off for it as for gRPC's DEADLINE_EXCEEDED).
"""

from __future__ import annotations

import contextlib
import http.client
import io
import ipaddress
import math
import netrc
import os
import select
import socket
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from email.message import Message
from typing import Any, cast

from ._otel_sdk import HttpResultBase, HttpTransportBase

MAX_ANSWER_BYTES = 1 << 20
"""An OTLP answer is a few bytes (a partial success and its message); a longer body is cut here and
its connection closed, so an endpoint cannot make the export thread read without end."""


class NoAnswerError(TimeoutError):
    """The request was sent and no answer came within its deadline."""


@dataclass(frozen=True, slots=True)
class Answer(HttpResultBase):  # type: ignore[misc]  # the SDK's BaseHTTPResult
    """One request's outcome: a status and body, or ``error``."""

    body: bytes = b""
    head: Message | None = field(default=None, hash=False, compare=False)

    def content(self) -> bytes:
        return self.body

    def headers(self) -> Mapping[str, str]:
        """The answer's headers, looked up case-insensitively (``http.client``'s)."""
        return cast("Mapping[str, str]", self.head if self.head is not None else {})


class KeptAlive(HttpTransportBase):  # type: ignore[misc]  # the SDK's BaseHTTPTransport
    """``http.client`` connections kept open between requests, one per host and port; closed for good by ``close``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        """Held by a request (the export thread's, one at a time); ``close`` never waits for it."""
        self._connections: dict[tuple[str, int], _Connection] = {}
        self._closed = False

    def request(
        self,
        method: str,
        url: str,
        *,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
        data: bytes | None = None,
    ) -> Answer:
        """One request, within ``timeout`` in all (connecting, sending and the answer), never raising."""
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        with self._lock:
            try:
                return self._request(method, url, headers, timeout, deadline, data)
            finally:
                if self._closed:  # ``close`` came while this request was connecting: its socket closes here
                    self._close_all()

    def _request(
        self, method: str, url: str, headers: dict[str, str] | None, timeout: float | None, deadline: float, data: Any
    ) -> Answer:
        if self._closed:
            return Answer(error=ConnectionAbortedError("the transport is shut down"))
        try:
            parts = urllib.parse.urlsplit(url)
            where = (parts.hostname or "", parts.port or 80)
            path = (parts.path or "/") + ("?" + parts.query if parts.query else "")
            connection = self._open(where)
        except (ValueError, http.client.HTTPException) as exc:  # not a URL, a port or host that is not one
            return Answer(error=exc)
        connection.deadline = deadline
        sent = False
        try:
            connection.request(method, path, body=data, headers=headers or {})
            sent = True
            response = connection.getresponse()
            body = response.read(MAX_ANSWER_BYTES)
            if not response.isclosed():  # longer than an answer is: not read on
                connection.close()
        except TimeoutError as exc:
            self._drop(where)
            return Answer(error=NoAnswerError(f"no answer within {timeout}s") if sent else exc)
        except Exception as exc:  # refused, reset, a malformed answer or header: never raised to the SDK
            self._drop(where)
            return Answer(error=exc)
        return Answer(status_code=response.status, reason=response.reason, body=body, head=response.headers)

    def _open(self, where: tuple[str, int]) -> _Connection:
        """The connection to ``where``, a new one if the server closed it (readable while idle: its end)."""
        connection = self._connections.get(where)
        if connection is None:
            connection = self._connections[where] = _Connection(*where)
            connection.closed = lambda: self._closed
        elif connection.sock is not None and _readable(connection.sock):
            connection.close()  # reconnects on its request
        return connection

    def _drop(self, where: tuple[str, int]) -> None:
        """Close and forget a connection a request failed on: ``http.client`` keeps what a failed
        request had buffered, which the next one on it would send first."""
        connection = self._connections.pop(where, None)
        if connection is not None:
            connection.close()

    def is_connection_error(self, exception: Exception | None) -> bool:
        """Whether the SDK's client may try again at once: no connection, or one the server closed."""
        return isinstance(exception, ConnectionError) and not self._closed

    def close(self) -> None:
        """Close every connection, a request in flight too (its socket shut down: it returns at once,
        as a stuck send at shutdown must), and take no more requests. Never waits: a request still
        resolving or connecting (no socket to shut down yet) closes its connection as it ends."""
        self._closed = True
        for connection in list(self._connections.values()):
            sock = connection.sock
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        if self._lock.acquire(blocking=False):
            try:
                self._close_all()
            finally:
                self._lock.release()

    def _close_all(self) -> None:
        for connection in list(self._connections.values()):
            connection.close()
        self._connections.clear()


class _Connection(http.client.HTTPConnection):
    """A connection whose every wait (connecting, each send, each read of the answer) takes only the
    time left before ``deadline``: ``http.client``'s own timeout starts again at each socket call,
    so a server trickling its answer a byte at a time would hold a request for ever."""

    deadline = math.inf
    closed: Callable[[], bool] = staticmethod(lambda: False)
    """Whether its transport was closed (``KeptAlive.close`` found no socket to shut down while it connected)."""

    def _left(self) -> float | None:
        if self.deadline == math.inf:
            return None
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request's deadline passed")
        return left

    def connect(self) -> None:
        self.timeout = self._left()
        super().connect()
        if self.closed():
            raise ConnectionAbortedError("the transport was shut down while connecting")
        self.sock.settimeout(self._left())  # the request's first send: what connecting left of the deadline

    def send(self, data: Any) -> None:
        if self.sock is not None:
            self.sock.settimeout(self._left())  # sendall's timeout bounds the whole call
        super().send(data)

    def response_class(self, sock: socket.socket, method: str | None = None) -> http.client.HTTPResponse:  # type: ignore[override]
        response = http.client.HTTPResponse(sock, method=method)
        response.fp.close()  # the buffered file ``http.client`` made: read through the deadline's instead
        response.fp = io.BufferedReader(_UntilDeadline(sock, self._left))
        return response


class _UntilDeadline(io.RawIOBase):
    """A socket's reads, each waiting only the time its connection's deadline leaves. Made by the
    socket's ``makefile``, as ``http.client``'s own file is, so the socket stays open while an answer
    that closes its connection is read."""

    def __init__(self, sock: socket.socket, left: Callable[[], float | None]) -> None:
        self._sock, self._left = sock, left
        self._raw = sock.makefile("rb", buffering=0)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        self._sock.settimeout(self._left())
        return self._raw.readinto(buffer)

    def close(self) -> None:
        self._raw.close()
        super().close()


def takes(url: str) -> bool:
    """Whether ``KeptAlive`` sends to ``url``: plain ``http://``, with no credentials of its own (the
    URL's user and password, a ``.netrc`` entry: ``requests`` sends them) and not through a proxy."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        if parts.scheme.lower() != "http" or parts.username is not None or not host:
            return False
        http.client.HTTPConnection(host, parts.port)  # checks the host as a request would (connects nowhere)
        return not proxied(host) and not _netrc_has(host)
    except (ValueError, http.client.HTTPException):  # a malformed URL: the SDK's transport says what is wrong
        return False


def proxied(host: str) -> bool:
    """Whether the proxy variables send requests to ``host`` through a proxy (the loopback interface never)."""
    try:
        if ipaddress.ip_address(host).is_loopback:
            return False
    except ValueError:  # a name
        if host.lower() == "localhost":
            return False
    proxies = urllib.request.getproxies()
    return bool({"http", "all"} & proxies.keys()) and not urllib.request.proxy_bypass(host)


def _netrc_has(host: str) -> bool:
    """Whether ``$NETRC`` or ``~/.netrc`` holds credentials for ``host`` (``requests`` sends them)."""
    path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
    if not os.path.isfile(path):
        return False
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return True  # unreadable: keep the SDK's transport, which reads it its own way


def _readable(sock: socket.socket) -> bool:
    """Whether an idle connection has something to read: its end (or bytes no request asked for)."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))
