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
``requests`` would, except on the loopback interface (the embedded sink's), never proxied.

What a transport must answer is the SDK's (``BaseHTTPTransport``): a status and body, or the error
that stopped the request; the SDK's client retries a connection error once at once (a connection
the server closed as it was reused). An answer not read in time is ``NoAnswerError``: the endpoint
took the request and is slow, not gone (``senders`` backs off for it as for gRPC's DEADLINE_EXCEEDED).
"""

from __future__ import annotations

import http.client
import select
import socket
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from email.message import Message
from typing import cast

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
    """``http.client`` connections kept open between requests, one per host and port."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._connections: dict[tuple[str, int], http.client.HTTPConnection] = {}

    def request(
        self,
        method: str,
        url: str,
        *,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
        data: bytes | None = None,
    ) -> Answer:
        parts = urllib.parse.urlsplit(url)
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        with self._lock:
            try:
                where = (parts.hostname or "", parts.port or 80)
            except ValueError as exc:  # a port that is not a number
                return Answer(error=exc)
            connection = self._open(where, timeout)
            deadline = None if timeout is None else time.monotonic() + timeout
            sent = False
            try:
                connection.request(method, path, body=data, headers=headers or {})
                sent = True
                if deadline is not None and connection.sock is not None:
                    connection.sock.settimeout(max(0.001, deadline - time.monotonic()))
                response = connection.getresponse()
                body = response.read(MAX_ANSWER_BYTES)
                if not response.isclosed():  # longer than an answer is: not read on
                    connection.close()
            except TimeoutError as exc:
                connection.close()
                return Answer(error=NoAnswerError(f"no answer within {timeout}s") if sent else exc)
            except (OSError, http.client.HTTPException) as exc:
                connection.close()
                return Answer(error=exc)
            return Answer(status_code=response.status, reason=response.reason, body=body, head=response.headers)

    def _open(self, where: tuple[str, int], timeout: float | None) -> http.client.HTTPConnection:
        """The connection to ``where``, a new one if the server closed it (readable while idle: its end)."""
        connection = self._connections.get(where)
        if connection is None:
            connection = self._connections[where] = http.client.HTTPConnection(*where, timeout=timeout)
        elif connection.sock is not None:
            if _readable(connection.sock):
                connection.close()  # reconnects on its next request
            else:
                connection.sock.settimeout(timeout)
        connection.timeout = timeout
        return connection

    def is_connection_error(self, exception: Exception | None) -> bool:
        """Whether the SDK's client may try again at once: no connection, or one the server closed."""
        return isinstance(exception, ConnectionError)

    def close(self) -> None:
        with self._lock:
            for connection in self._connections.values():
                connection.close()
            self._connections.clear()


def takes(url: str) -> bool:
    """Whether ``KeptAlive`` sends to ``url``: plain ``http://``, not through a proxy."""
    return url.lower().startswith("http://") and not proxied(url)


def proxied(url: str) -> bool:
    """Whether the proxy variables send ``url`` through a proxy (the loopback interface never)."""
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost" or host.startswith("127.") or host == "::1":
        return False
    return "http" in urllib.request.getproxies() and not urllib.request.proxy_bypass(host)


def _readable(sock: socket.socket) -> bool:
    """Whether an idle connection has something to read: its end (or bytes no request asked for)."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))
