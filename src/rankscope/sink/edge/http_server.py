"""OTLP/HTTP transport on aiohttp: one event loop, no thread per connection.

Routes: ``POST /v1/metrics|traces|logs`` (OTLP, protobuf or JSON, optionally gzip); everything
under ``/rankscope/`` and ``/healthz`` is a control route (``edge.control``).

Facing a network (``edge.connections``): a request head must arrive whole within
``header_timeout`` of its first byte (of the connection's opening, for the first), a kept-alive
connection may idle ``idle_connection_timeout`` between requests, at most ``max_connections``
are open, ``per_peer_connections`` of one address (a newcomer beyond closes the one waiting
longest for its head, else the slowest body, else the longest idle), the listen
backlog is 1024 (out of file descriptors, a newcomer is answered 503: ``edge.listener``), a
body over ``max_body_bytes`` is answered 413 from its Content-Length
without being read, one that takes longer than ``body_timeout`` to arrive is answered 408
(a trickled body would hold its connection; either is closed after at most 2 s more), and the bearer token is checked by
``edge.auth`` before any body is read. Decoding and merging run on a small thread pool, so a
large request never stalls the loop that answers everyone else.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web

from .auth import UNAUTHORIZED, Keys
from .backlog import Backlog
from .bodies import decode_body, encode_response, encode_status, media_type
from .connections import MIN_BODY_RATE, Connection, ConnectionServer, Counts
from .control import ControlRoutes
from .errors import ANSWERS, HttpError, Kind, RefusedError
from .listener import Listener, OnExhausted
from .ports import Client, Control, Ingest, Spawn, Transport

_REJECTED_FIELD = {"metrics": "rejected_data_points", "traces": "rejected_spans", "logs": "rejected_log_records"}


_LINGER = 2.0
"""Seconds a connection answered before its body ended (413, 408) may still send before it is closed
(aiohttp's default, 10, would let a trickling client hold it that much longer)."""


class _Routes:
    """OTLP ingest, and the control routes handed to ``edge.control``."""

    def __init__(
        self,
        ingest: Ingest,
        control: Control,
        config: Transport,
        pool: ThreadPoolExecutor,
        max_id_chars: int,
        backlog: Backlog,
        counts: Counts | None = None,
    ) -> None:
        self.ingest = ingest
        self.backlog = backlog
        self.config = config
        self.pool = pool
        self.keys = Keys(config.token, config.tokens, counts.refused_token if counts is not None else None)
        self.control = ControlRoutes(control, self.keys, self._call, self._body, max_id_chars=max_id_chars)

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        try:
            if self.control.serves(request.path):
                return await self.control.handle(request)
            if request.method == "POST":
                return await self._post(request)
            raise HttpError(Kind.METHOD_NOT_ALLOWED, f"{request.method} is not served here")
        except HttpError as error:
            return error_response(request, error)

    async def _call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def _body(self, request: web.BaseRequest) -> bytes:
        config = self.config
        limit = config.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise HttpError(Kind.TOO_LARGE, f"body of {request.content_length} bytes exceeds the {limit}-byte limit")
        return await _read_body(request, limit, config.body_timeout)

    async def _post(self, request: web.BaseRequest) -> web.StreamResponse:
        scope = self.keys.scope_of_headers(request.headers.getall("Authorization", []))
        if scope is None:
            raise HttpError(Kind.UNAUTHORIZED, UNAUTHORIZED)
        body = await self._body(request)
        with self.backlog.held():  # received whole: a step's grace waits for it (edge.backlog)
            decoded = await self._call(
                decode_body,
                request.path,
                request.headers.get("Content-Type"),
                request.headers.get("Content-Encoding"),
                body,
                self.config.max_body_bytes,
            )
            export = {
                "metrics": self.ingest.export_metrics,
                "traces": self.ingest.export_traces,
                "logs": self.ingest.export_logs,
            }[decoded.signal]
            try:
                client = Client(peer=request.remote or "", scope=scope, alive=lambda: _connected(request))
                result = await self._call(export, decoded.request, client)
            except RefusedError as exc:
                raise HttpError(exc.kind, str(exc)) from None
        response = decoded.response_class()
        if result.rejected:
            setattr(response.partial_success, _REJECTED_FIELD[decoded.signal], result.rejected)
            response.partial_success.error_message = result.message
        content_type, payload = encode_response(decoded, response)
        return web.Response(status=200, body=payload, content_type=content_type)


async def _read_body(request: web.BaseRequest, limit: int, timeout: float) -> bytes:
    """The body, unless it is over ``limit`` (413) or slower than ``timeout`` seconds plus one per
    ``MIN_BODY_RATE`` bytes received (408): a slow link's body arrives, a trickled one does not."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    chunks: list[bytes] = []
    size = 0
    connection = request.protocol if isinstance(request.protocol, Connection) else None
    if connection is not None:
        connection.reading(0)  # its rate from now: a slow body may be closed to make room
    try:
        while True:
            chunk = await _chunk(request, loop, started + timeout + size / MIN_BODY_RATE, size, timeout)
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > limit:
                raise HttpError(Kind.TOO_LARGE, f"body exceeds the {limit}-byte limit")
            chunks.append(chunk)
            if connection is not None:
                connection.reading(size)
    finally:
        if connection is not None:
            connection.read()


async def _chunk(
    request: web.BaseRequest, loop: asyncio.AbstractEventLoop, deadline: float, size: int, timeout: float
) -> bytes:
    """The body's next chunk (b"": its end), or 408 once ``deadline`` (loop time) passed."""
    left = deadline - loop.time()
    try:
        if left <= 0:
            raise asyncio.TimeoutError
        return await asyncio.wait_for(request.content.readany(), left)
    except asyncio.TimeoutError:
        raise HttpError(Kind.BODY_TIMEOUT, f"body of {size} bytes so far not received within {timeout:g} s") from None
    except (RuntimeError, ConnectionError):  # aiohttp: "Connection closed." (by the client, or to make room)
        raise HttpError(Kind.BAD_REQUEST, f"connection closed after {size} bytes of the body") from None


def _connected(request: web.BaseRequest) -> bool:
    """Whether the request's client still waits for its answer (read off the loop's thread: a flag)."""
    transport = request.transport
    return transport is not None and not transport.is_closing()


def error_response(request: web.BaseRequest, error: HttpError) -> web.Response:
    """The answer to a refusal, all of it from its kind's row in ``ANSWERS`` (``edge.errors``)."""
    answer = ANSWERS[error.kind]
    json_body = media_type(request.headers.get("Content-Type")) == "application/json"
    content_type, body = encode_status(error.message, answer.grpc.value[0], json_body)
    headers = {"Retry-After": str(answer.retry_after)} if answer.retry_after is not None else {}
    response = web.Response(status=answer.http, body=body, content_type=content_type, headers=headers)
    if answer.close:
        response.force_close()  # the unread body (or an unauthenticated peer) does not keep the connection
    return response


class HttpServer:
    """The aiohttp server on its own event-loop thread (supervised by the sink)."""

    def __init__(
        self,
        ingest: Ingest,
        control: Control,
        config: Transport,
        port: int,
        on_exhausted: OnExhausted | None = None,
        max_id_chars: int = 256,
        counts: Counts | None = None,
        backlog: Backlog | None = None,
    ) -> None:
        self.loop = asyncio.new_event_loop()
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="rankscope-sink-http")
        routes = _Routes(ingest, control, config, self.pool, max_id_chars, backlog or Backlog(), counts)
        server = ConnectionServer(
            routes.handle,
            loop=self.loop,
            max_connections=config.max_connections,
            per_peer=config.per_peer_connections or max(8, config.max_connections // 4),
            counts=counts,
            header_timeout=config.header_timeout,
            write_timeout=config.body_timeout,
            keepalive_timeout=config.idle_connection_timeout,
            lingering_time=_LINGER,
            access_log=None,
            auto_decompress=False,  # bodies.decompress inflates with the size cap
        )
        self.runner = web.ServerRunner(server, handle_signals=False, access_log=None)
        self.loop.run_until_complete(self.runner.setup())
        # accepting is ours, not asyncio's: out of descriptors, a connection is refused with a
        # reason instead of a spin and a traceback per attempt (``edge.listener``)
        self.listener = Listener(self.loop, server, config.host, port, backlog=1024, on_exhausted=on_exhausted)
        self.listener.start()
        self.port = self.listener.port
        self._stopped = threading.Event()

    def serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()
        self.listener.close()
        self.loop.run_until_complete(self.runner.cleanup())
        self.loop.close()
        self._stopped.set()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._stopped.wait(5.0)
        self.pool.shutdown(wait=False, cancel_futures=True)


def start_http(
    ingest: Ingest,
    control: Control,
    config: Transport,
    port: int,
    spawn: Spawn,
    on_exhausted: OnExhausted | None = None,
    max_id_chars: int = 256,
    counts: Counts | None = None,
    backlog: Backlog | None = None,
) -> tuple[HttpServer, int]:
    """Listen on ``config.host:port`` (0: any free port) and serve on a thread from ``spawn``;
    ``on_exhausted`` counts connections refused for want of a descriptor; ``max_id_chars``: an
    experiment id the control routes take (``checked.Limits.max_id_chars``, as the OTLP edge);
    ``counts``: where the connection rules count what they did (the status route's); ``backlog``:
    where a request is held from its body's end until it is answered (``edge.backlog``)."""
    server = HttpServer(ingest, control, config, port, on_exhausted, max_id_chars, counts, backlog)
    spawn("http", server.serve)
    return server, server.port
