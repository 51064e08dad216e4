"""The HTTP transport's listening socket: accepting never spins and never floods the log.

asyncio's own accept loop (``selector_events._accept_connection``, Python 3.11) meets EMFILE by
logging a traceback and scheduling a retry for *each* of ``backlog`` attempts in one go, and
each retry does the same: out of descriptors, it spins at 100 % CPU and writes millions of
tracebacks. ``Listener`` accepts itself and hands each connection to the loop
(``loop.connect_accepted_socket``, public API). Out of descriptors (EMFILE, ENFILE), it gives
back a spare descriptor it keeps for the purpose, accepts the waiting connection on it, answers
``503`` with ``Retry-After`` and the reason, and closes it: the client is refused with a reason
(OTLP clients retry a 503), the backlog drains, nothing is retried in a loop. The refusal is
counted and logged at most every few seconds by ``on_exhausted`` (``durable.descriptors``). If
even the spare cannot be had back, accepting pauses for ``PAUSE`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from .errors import ANSWERS, Kind

log = logging.getLogger("rankscope.sink")

PAUSE = 0.25
"""Seconds accepting pauses when not even the spare descriptor can be had back."""
BATCH = 64
"""Connections accepted per readiness event at most (others wait for the next turn of the loop)."""
_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_REASON = b"the sink is out of file descriptors; retry"
_ANSWER = ANSWERS[Kind.OUT_OF_DESCRIPTORS]
REFUSAL = (
    f"HTTP/1.1 {_ANSWER.http} {HTTPStatus(_ANSWER.http).phrase}\r\nContent-Type: text/plain\r\n"
    f"Retry-After: {_ANSWER.retry_after}\r\nConnection: close\r\nContent-Length: {len(_REASON)}\r\n\r\n"
).encode() + _REASON

OnExhausted = Callable[[str, BaseException], None]


class Listener:
    """A listening TCP socket on ``loop`` whose connections go to ``factory`` (an asyncio
    protocol factory: aiohttp's ``web.Server``)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        factory: Callable[[], Any],
        host: str,
        port: int,
        *,
        backlog: int = 1024,
        on_exhausted: OnExhausted | None = None,
    ) -> None:
        self.loop = loop
        self.factory = factory
        self.on_exhausted = on_exhausted
        if not host and socket.has_dualstack_ipv6():  # every interface, both families (as asyncio binds "")
            self.sock = socket.create_server(("", port), family=socket.AF_INET6, backlog=backlog, dualstack_ipv6=True)
        else:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            self.sock = socket.create_server((host, port), family=family, backlog=backlog)
        self.sock.setblocking(False)
        self.port = int(self.sock.getsockname()[1])
        self.refused = 0
        """Connections refused for want of a descriptor."""
        self._spare: int | None = _spare()
        self._paused = False
        self._closed = False
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        """Accept on the loop (call before it runs, or on its thread)."""
        self.loop.add_reader(self.sock.fileno(), self._ready)

    def close(self) -> None:
        """Stop accepting (on the loop's thread, or once it stopped)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self.loop.remove_reader(self.sock.fileno())
        self.sock.close()
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None

    def _ready(self) -> None:
        for _ in range(BATCH):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno in _RESOURCES:
                    self._refuse(exc)
                else:  # not ours to fix (the socket closed under us): said once, accepting goes on
                    log.warning("rankscope sink: accept failed: %r", exc)
                return
            conn.setblocking(False)
            task = self.loop.create_task(self._serve(conn))
            self._tasks.add(task)  # the loop keeps only a weak reference
            task.add_done_callback(self._tasks.discard)

    async def _serve(self, conn: socket.socket) -> None:
        try:
            await self.loop.connect_accepted_socket(self.factory, conn)
        except OSError as exc:  # out of descriptors making its transport: closed, counted
            conn.close()
            if exc.errno in _RESOURCES and self.on_exhausted is not None:
                self.refused += 1
                self.on_exhausted("accept", exc)

    def _refuse(self, exc: OSError) -> None:
        """Out of descriptors: the waiting connection is answered 503 on the spare descriptor."""
        self.refused += 1
        if self.on_exhausted is not None:
            self.on_exhausted("accept", exc)
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None
        try:
            conn, _ = self.sock.accept()
        except OSError:
            conn = None
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.setblocking(False)
                conn.send(REFUSAL)
            conn.close()
        self._spare = _spare()
        if self._spare is None or conn is None:  # nothing to accept with: wait rather than spin
            self._pause()

    def _pause(self) -> None:
        if self._paused or self._closed:
            return
        self._paused = True
        self.loop.remove_reader(self.sock.fileno())
        self.loop.call_later(PAUSE, self._resume)

    def _resume(self) -> None:
        self._paused = False
        if self._closed:
            return
        if self._spare is None:
            self._spare = _spare()
        self.loop.add_reader(self.sock.fileno(), self._ready)


def _spare() -> int | None:
    """A descriptor kept to be given back when the process has none left (None: none to keep)."""
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
