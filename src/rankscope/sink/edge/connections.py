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
  else the one idle longest between requests, rather than being refused: connections that have
  not said what they want, or said it and went quiet, cannot lock out one that will (on loopback,
  behind a NAT or a Collector every client has the same address, so a cap per peer could not
  tell them apart; a kept-alive exporter whose connection was closed opens another). Only when
  every connection is being served is the newcomer closed.

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
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import StreamReader

SAY_INTERVAL = 10.0
"""Seconds between two log lines of one kind (what aiohttp logs of the connections)."""


class Connection(web.RequestHandler):
    """aiohttp's handler of one connection, knowing whether it waits for a request head (and since when)."""

    __slots__ = ("_deadline", "_header_timeout", "_loop_of", "head_since", "idle_since", "serving")

    def __init__(self, manager: web.Server, *, loop: asyncio.AbstractEventLoop, header_timeout: float, **kwargs: Any):
        super().__init__(manager, loop=loop, **kwargs)
        self._loop_of = loop
        self._header_timeout = header_timeout
        self._deadline: asyncio.TimerHandle | None = None
        self.head_since: float | None = None
        """Loop time its awaited request head began (its opening, or its first byte); None: not waiting."""
        self.idle_since: float | None = None
        """Loop time its last answer was given, while it has not begun another request; None: not idle."""
        self.serving = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._await_head()  # before the server counts it: a newcomer is the youngest waiting
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
        self.idle_since = self._loop_of.time()

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
            self.force_close()


class ConnectionServer(web.Server):
    """aiohttp's low-level server with ``Connection`` handlers: at most ``max_connections`` open,
    the one waiting longest for its head closed to make room for a newcomer."""

    def __init__(
        self,
        handler: Any,
        *,
        loop: asyncio.AbstractEventLoop,
        max_connections: int,
        header_timeout: float,
        **kwargs: Any,
    ) -> None:
        super().__init__(self._serve, request_factory=self._request, loop=loop, **kwargs)
        self._handle = handler
        self._loop_of = loop
        self._handler_kwargs = {"logger": QuietLog(logging.getLogger("rankscope.sink.http")), **kwargs}
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.made_room = 0
        """Connections closed, still waiting for their head, to make room for a newcomer."""
        self.closed_idle = 0
        """Connections closed, idle between requests, to make room for a newcomer."""
        self.turned_away = 0
        """Newcomers closed at once: every open connection was being served."""

    def __call__(self) -> Connection:
        return Connection(self, loop=self._loop_of, header_timeout=self.header_timeout, **self._handler_kwargs)

    def connection_made(self, handler: web.RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        open_ = [c for c in self.connections if c.transport is not None]  # not those closing already
        if len(open_) <= self.max_connections:
            return
        others = [c for c in open_ if c is not handler and isinstance(c, Connection)]
        waiting = [c for c in others if c.waiting]
        if waiting:
            min(waiting, key=lambda c: c.head_since or 0.0).force_close()
            self.made_room += 1
            return
        idle = [c for c in others if c.idle]
        if idle:
            min(idle, key=lambda c: c.idle_since or 0.0).force_close()
            self.closed_idle += 1
        else:
            handler.force_close()
            self.turned_away += 1

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
        try:
            response: web.StreamResponse = await self._handle(request)
            return response
        finally:
            if isinstance(request.protocol, Connection):
                request.protocol.ended()


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
