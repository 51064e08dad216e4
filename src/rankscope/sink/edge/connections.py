"""The HTTP transport's connections: how many it holds, and how long one may take to ask.

aiohttp's low-level server (``web.Server``) makes one ``RequestHandler`` per connection. Here
each knows what it is doing: *waiting for a request head* (since it opened, or since the first
byte of its next request after an answer), *serving* one (from its whole head to the handler's
answer), or *idle* between requests (a kept-alive client's connection). Two rules follow:

- A request head must arrive whole within ``header_timeout`` seconds of its first byte (of the
  connection's opening, for its first request), or the connection is closed: a client sending
  half a header, or nothing at all, holds its connection seconds, not the ``idle_connection_timeout``
  a kept-alive connection may idle between requests, nor the body's ``body_timeout``.
- At ``max_connections``, a new connection closes the one that has waited longest for its head,
  else the *slow* one reading its body longest (one that arrives at under ``MIN_BODY_RATE`` bytes
  a second, judged over ``SLOW_AFTER`` seconds at least), else the one idle longest, rather
  than being refused: connections that have not said what they want, are trickling it, or said
  it and went quiet cannot lock out one that will (a kept-alive exporter whose connection was
  closed opens another). Only when every connection is being served is the newcomer closed.
- One peer address holds at most ``per_peer`` of them: past that, its newcomer closes one of
  *its own* connections by the same order (or is closed itself), so one address cannot take
  every slot from the others even with connections the rule above would keep. Behind a NAT or a
  Collector every client has the same address: the cap is a share of ``max_connections``, not a
  count one exporter could reach (an exporter holds one or two).

``Counts`` keeps what the rules did, for the status route (``connections``).

What aiohttp logs of its connections goes through ``QuietLog``: a request it cannot parse is the
client's fault, not the sink's (a WARNING without a traceback, not an ERROR with one), and each
kind is said at most once per ``SAY_INTERVAL`` with the count of those not said, so a client
sending 2,000 malformed requests writes a line, not 2,000 tracebacks.

All of it runs on the server's event loop: no lock.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import StreamReader

from .ports import network_of

SAY_INTERVAL = 10.0
"""Seconds between two log lines of one kind (what aiohttp logs of the connections)."""
MIN_BODY_RATE = 64 * 1024
"""Bytes a second a body must average: past ``SLOW_AFTER`` seconds a slower one may be closed to
make room, and past the body's deadline it is answered 408 (``http_server``)."""
SLOW_AFTER = 1.0
"""Seconds over which a body's rate is judged at least: one just begun is slow only if it has
sent less than this many seconds' worth, and is closed after every older slow one."""


class Counts:
    """What the connection rules did, both transports' HTTP side (the status route's ``connections``).
    Written on the server's loop, read by the status route: plain integers, no lock."""

    __slots__ = ("closed", "open", "per_peer", "relay_failed", "timed_out", "turned_away", "unauthorized")

    def __init__(self) -> None:
        self.open = 0
        """Connections open now."""
        self.per_peer = 0
        """The cap per peer address the server runs with (0 before it starts)."""
        self.closed = {"waiting": 0, "slow": 0, "idle": 0}
        """Connections closed to make room for a newcomer, by what they were doing."""
        self.turned_away = {"full": 0, "per_peer": 0}
        """Newcomers closed at once: every connection (of their peer) was being served."""
        self.timed_out = 0
        """gRPC connections closed by the relay for going quiet both ways (``front``)."""
        self.relay_failed = 0
        """gRPC connections closed because the relay could not reach grpcio's end (``front``: out of
        descriptors, grpcio stopping): the client reconnects."""
        self.unauthorized = 0
        """Requests answered 401 / UNAUTHENTICATED: a missing or wrong bearer token (``auth.Keys``)."""

    def refused_token(self) -> None:
        """A request answered 401 / UNAUTHENTICATED (``auth.Keys``)."""
        self.unauthorized += 1

    def status(self) -> dict[str, object]:
        return {
            "open": self.open,
            "per_peer": self.per_peer,
            "closed_to_make_room": dict(self.closed),
            "turned_away": dict(self.turned_away),
            "timed_out": self.timed_out,
            "relay_failed": self.relay_failed,
            "unauthorized": self.unauthorized,
        }


class Connection(web.RequestHandler):
    """aiohttp's handler of one connection, knowing whether it waits for a request head (and since when)."""

    __slots__ = (
        "_deadline",
        "_header_timeout",
        "_loop_of",
        "_write_timeout",
        "body_bytes",
        "body_since",
        "head_since",
        "idle_since",
        "peer",
        "serving",
        "writing_since",
    )

    def __init__(
        self,
        manager: web.Server,
        *,
        loop: asyncio.AbstractEventLoop,
        header_timeout: float,
        write_timeout: float = 60.0,
        **kwargs: Any,
    ):
        super().__init__(manager, loop=loop, **kwargs)
        self._loop_of = loop
        self._header_timeout = header_timeout
        self._write_timeout = write_timeout
        self.writing_since: float | None = None
        """Loop time its answer began to be written; None: not writing one."""
        self._deadline: asyncio.TimerHandle | None = None
        self.head_since: float | None = None
        """Loop time its awaited request head began (its opening, or its first byte); None: not waiting."""
        self.idle_since: float | None = None
        """Loop time its last answer was given, while it has not begun another request; None: not idle."""
        self.serving = False
        self.body_since: float | None = None
        """Loop time its request's body began to be read; None: not reading one."""
        self.body_bytes = 0
        self.peer = ""
        """Its peer's address (its host, an IPv6 one by its /64: ``ports.network_of``)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._await_head()  # before the server counts it: a newcomer is the youngest waiting
        peer = transport.get_extra_info("peername")
        self.peer = network_of(str(peer[0])) if isinstance(peer, tuple) and peer else ""
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if data and self.head_since is None and not self.serving:
            self.idle_since = None
            self._await_head()  # the first byte of its next request, after an answer
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def began(self) -> None:
        """A whole request head arrived: it is served now (no head deadline while it is)."""
        self.serving = True
        self._disarm()

    def ended(self) -> None:
        """The request's handler answered: idle until the next request's first byte."""
        self.serving = False
        self.body_since = None
        self.idle_since = self._loop_of.time()

    def reading(self, received: int) -> None:
        """Its handler reads the request's body: ``received`` bytes of it so far."""
        if self.body_since is None:
            self.body_since = self._loop_of.time()
        self.body_bytes = received

    def read(self) -> None:
        """The whole body arrived (or was refused): no longer reading."""
        self.body_since = None

    def slow(self, now: float) -> bool:
        """Whether its body arrives slower than ``MIN_BODY_RATE`` (judged over ``SLOW_AFTER``
        seconds at least, so a body just begun counts as slow only after its older peers), or its
        answer has been written for ``SLOW_AFTER`` seconds (a client that does not read)."""
        if self.transport is None:
            return False
        if self.writing_since is not None:
            return now - self.writing_since >= SLOW_AFTER
        if self.body_since is None:
            return False
        return self.body_bytes < MIN_BODY_RATE * max(now - self.body_since, SLOW_AFTER)

    @property
    def slow_since(self) -> float:
        """Since when it is reading its body, or writing its answer (the older one is closed first)."""
        return self.body_since or self.writing_since or 0.0

    async def finish_response(
        self, request: web.BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        """aiohttp writes the answer: within ``write_timeout`` (else the connection is aborted),
        counted as serving until it is written (then idle)."""
        self.writing_since = self._loop_of.time()
        try:
            return await asyncio.wait_for(super().finish_response(request, resp, start_time), self._write_timeout)
        except asyncio.TimeoutError:
            self.abort()
            return resp, True
        finally:
            self.writing_since = None
            self.ended()

    def abort(self) -> None:
        """Close it now, dropping what is unsent (``close`` would wait for a client that does not
        read, holding its descriptor and buffers)."""
        transport = self.transport
        self.force_close()
        if transport is not None:
            transport.abort()

    @property
    def idle(self) -> bool:
        """Whether it idles between requests (a candidate to close at ``max_connections`` when none waits)."""
        return (
            self.idle_since is not None and self.head_since is None and not self.serving and self.transport is not None
        )

    @property
    def waiting(self) -> bool:
        """Whether it waits for a request head (a candidate to close at ``max_connections``)."""
        return self.head_since is not None and not self.serving and self.transport is not None

    def _await_head(self) -> None:
        now = self._loop_of.time()
        self.head_since = now
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self._loop_of.call_at(now + self._header_timeout, self._head_overdue)

    def _disarm(self) -> None:
        self.head_since = None
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _head_overdue(self) -> None:
        self._deadline = None
        if self.head_since is not None and not self.serving:
            self.abort()


class ConnectionServer(web.Server):
    """aiohttp's low-level server with ``Connection`` handlers: at most ``max_connections`` open and
    ``per_peer`` of one address, room made for a newcomer by the rules of the module docstring."""

    def __init__(
        self,
        handler: Any,
        *,
        loop: asyncio.AbstractEventLoop,
        max_connections: int,
        header_timeout: float,
        write_timeout: float = 60.0,
        per_peer: int = 0,
        counts: Counts | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(self._serve, request_factory=self._request, loop=loop, **kwargs)
        self._handle = handler
        self._loop_of = loop
        self._handler_kwargs = {"logger": QuietLog(logging.getLogger("rankscope.sink.http")), **kwargs}
        self.max_connections = max_connections
        self.per_peer = per_peer or max_connections
        self.header_timeout = header_timeout
        self.write_timeout = write_timeout
        self.counts = counts or Counts()
        self.counts.per_peer = self.per_peer

    def __call__(self) -> Connection:
        return Connection(
            self,
            loop=self._loop_of,
            header_timeout=self.header_timeout,
            write_timeout=self.write_timeout,
            **self._handler_kwargs,
        )

    def connection_made(self, handler: web.RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        open_ = [c for c in self.connections if c.transport is not None]  # not those closing already
        self.counts.open = len(open_)
        if not isinstance(handler, Connection):
            return
        same = [c for c in open_ if isinstance(c, Connection) and c.peer == handler.peer]
        if len(same) > self.per_peer:
            self._make_room(handler, same, "per_peer")
        elif len(open_) > self.max_connections:
            self._make_room(handler, open_, "full")

    def connection_lost(self, handler: web.RequestHandler, exc: BaseException | None = None) -> None:
        super().connection_lost(handler, exc)
        # aiohttp tells the server before the handler lets go of its transport, and forgets the
        # handler only once its task ends: the lost one is still listed here, looking open.
        self.counts.open = sum(1 for c in self.connections if c.transport is not None and c is not handler)

    def _make_room(self, newcomer: Connection, among: Sequence[web.RequestHandler], bound: str) -> None:
        """Close the first of ``among`` (but the newcomer) by the module's order; else the newcomer."""
        others = [c for c in among if c is not newcomer and isinstance(c, Connection)]
        now = self._loop_of.time()
        waiting = [c for c in others if c.waiting]
        if waiting:
            self._close(min(waiting, key=lambda c: c.head_since or 0.0), "waiting")
            return
        slow = [c for c in others if c.slow(now)]
        if slow:
            self._close(min(slow, key=lambda c: c.slow_since), "slow")
            return
        idle = [c for c in others if c.idle]
        if idle:
            self._close(min(idle, key=lambda c: c.idle_since or 0.0), "idle")
            return
        newcomer.abort()
        self.counts.turned_away[bound] += 1

    def _close(self, connection: Connection, doing: str) -> None:
        connection.abort()
        self.counts.closed[doing] += 1

    def _request(
        self,
        message: RawRequestMessage,
        payload: StreamReader,
        protocol: web.RequestHandler,
        writer: AbstractStreamWriter,
        task: asyncio.Task[None],
    ) -> web.BaseRequest:
        if isinstance(protocol, Connection):
            protocol.began()
        return web.BaseRequest(message, payload, protocol, writer, task, self._loop_of)

    async def _serve(self, request: web.BaseRequest) -> web.StreamResponse:
        response: web.StreamResponse = await self._handle(request)
        return response  # ``Connection.finish_response`` writes it, then the connection idles


class QuietLog(logging.LoggerAdapter):  # type: ignore[type-arg]  # generic only from Python 3.11
    """What aiohttp logs of the connections (its ``RequestHandler``'s ``logger``): a request it cannot
    parse (``HttpProcessingError``) is said as a WARNING without its traceback; every kind (level,
    exception class, message) at most once per ``interval``, with how many were not said since."""

    def __init__(
        self, logger: logging.Logger, *, interval: float = SAY_INTERVAL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(logger, {})
        self.interval = interval
        self.clock = clock
        self._kinds: dict[tuple[int, str, str], tuple[float, int]] = {}
        """Kind -> (clock time it was last said, how many were not said since)."""

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if level < logging.WARNING or not self.isEnabledFor(level):
            super().log(level, msg, *args, **kwargs)
            return
        exc = _exception(kwargs.get("exc_info"))
        if isinstance(exc, HttpProcessingError):  # a client's bad bytes: said, not traced
            level, kwargs["exc_info"] = logging.WARNING, None
            if "PRI/Upgrade" in str(exc):  # HTTP/2's preface: an OTLP/gRPC exporter given this port
                msg, args = f"{msg}: an OTLP/gRPC client (HTTP/2) at the OTLP/HTTP port: give it the gRPC port", args
            else:
                msg, args = f"{msg}: %s", (*args, " ".join(str(exc).split())[:200])
        kind = (level, type(exc).__name__ if exc is not None else "", str(msg))
        now = self.clock()
        said, unsaid = self._kinds.get(kind, (None, 0))
        if said is not None and now - said < self.interval:
            self._kinds[kind] = (said, unsaid + 1)
            return
        if len(self._kinds) >= 256:  # kinds are aiohttp's few messages and exception classes; a bound all the same
            self._kinds.clear()
        self._kinds[kind] = (now, 0)
        if unsaid:
            msg = f"{msg} (and {unsaid} more like it in the last {self.interval:g} s)"
        super().log(level, msg, *args, **kwargs)


def _exception(exc_info: Any) -> BaseException | None:
    """The exception a log call's ``exc_info`` names (an exception, True: the one being handled, a tuple)."""
    if isinstance(exc_info, BaseException):
        return exc_info
    if exc_info is True:
        return sys.exc_info()[1]
    if isinstance(exc_info, tuple) and len(exc_info) == 3:
        found = exc_info[1]
        return found if isinstance(found, BaseException) else None
    return None
