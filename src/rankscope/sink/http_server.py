"""OTLP/HTTP transport on aiohttp: one event loop, no thread per connection.

Routes: ``POST /v1/metrics|traces|logs`` (OTLP, protobuf or JSON, optionally gzip),
``GET /healthz`` (503 naming a dead sink thread), and the control routes for embedded
clients and people: ``POST /rankscope/v1/config`` (an experiment's views),
``GET /rankscope/v1/status[?experiment=ID[&run=RUN]]`` (a route that names an experiment
takes ``run``, else means its latest run; a resuming launch's own run id means the run it
continues) and
``GET /rankscope/v1/spans?experiment=ID[&first=N][&last=M][&ranks=0,2-3]`` (stored spans as
JSONL, streamed; what ``rankscope gantt --sink`` reads),
``GET /rankscope/v1/recent?experiment=ID`` (the last 64 finalized steps: values, missing,
anomalies, rank x phase seconds; what ``rankscope top`` reads), and captures (``sink.captures``):
``POST /rankscope/v1/captures`` (``{"experiment", "steps", "ranks", "reason"}``: ask for one),
``GET /rankscope/v1/captures?experiment=ID&process=PID`` (a process polls for its requests) and
``PUT /rankscope/v1/captures/file?experiment=ID&capture=C&process=PID`` (its trace, gzip), and
``POST /rankscope/v1/report`` (``{"experiment"}``: write its report page now, answer where).

Facing a network: connections that send nothing are closed after
``idle_connection_timeout`` (aiohttp's keep-alive timer starts when the connection opens),
at most ``max_connections`` are open (the newest beyond is closed at once), the listen
backlog is 1024, a body over ``max_body_bytes`` is answered 413 from its Content-Length
without being read, and the bearer token is compared in constant time with a
case-insensitive scheme. Decoding and merging run on a small thread pool, so a large
request never stalls the loop that answers everyone else.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from aiohttp import web

from .bodies import HttpError, OverloadedError, decode_body, encode_response, encode_status, media_type
from .traces import parse_ranks

if TYPE_CHECKING:
    from .service import Sink

REPORT_TIMEOUT = 60.0
"""Seconds the report route waits for an experiment's views (``request_report`` waits longer)."""
_GRPC_CODES = {400: 3, 401: 16, 404: 5, 411: 3, 413: 8, 415: 3, 429: 8, 503: 14}
_REJECTED_FIELD = {"metrics": "rejected_data_points", "traces": "rejected_spans", "logs": "rejected_log_records"}


def authorized(expected: str | None, header: str | None) -> bool:
    """``Authorization: Bearer <token>`` (scheme in any case), compared in constant time."""
    if expected is None:
        return True
    scheme, _, token = (header or "").strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), expected.encode())


class _CappedServer(web.Server):
    """aiohttp's low-level server with a cap on open connections."""

    max_connections = 1024

    def connection_made(self, handler: Any, transport: Any) -> None:
        super().connection_made(handler, transport)
        if len(self.connections) > self.max_connections:
            transport.close()


class _Routes:
    def __init__(self, sink: Sink, pool: ThreadPoolExecutor) -> None:
        self.sink = sink
        self.pool = pool
        self._report_lock = threading.Lock()
        self._reporting: set[str] = set()

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        try:
            if request.method == "POST":
                return await self._post(request)
            if request.method == "GET":
                return await self._get(request)
            if request.method == "PUT" and request.path == "/rankscope/v1/captures/file":
                return await self._capture_file(request)
            raise HttpError(405, f"{request.method} is not served here")
        except HttpError as error:
            return _error(request, error)

    async def _call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def _body(self, request: web.BaseRequest) -> bytes:
        limit = self.sink.config.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise HttpError(413, f"body of {request.content_length} bytes exceeds the {limit}-byte limit")
        chunks, size = [], 0
        async for chunk in request.content.iter_chunked(1 << 16):
            size += len(chunk)
            if size > limit:
                raise HttpError(413, f"body exceeds the {limit}-byte limit")
            chunks.append(chunk)
        return b"".join(chunks)

    def _auth(self, request: web.BaseRequest) -> None:
        if not authorized(self.sink.config.token, request.headers.get("Authorization")):
            raise HttpError(401, "missing or wrong bearer token")

    async def _post(self, request: web.BaseRequest) -> web.StreamResponse:
        self._auth(request)
        body = await self._body(request)
        if request.path == "/rankscope/v1/config":
            return await self._config(body)
        if request.path == "/rankscope/v1/captures":
            return await self._capture(body)
        if request.path == "/rankscope/v1/report":
            return await self._report(body)
        decoded = await self._call(
            decode_body,
            request.path,
            request.headers.get("Content-Type"),
            request.headers.get("Content-Encoding"),
            body,
            self.sink.config.max_body_bytes,
        )
        export = {
            "metrics": self.sink.export_metrics,
            "traces": self.sink.export_traces,
            "logs": self.sink.export_logs,
        }[decoded.signal]
        try:
            result = await self._call(export, decoded.request)
        except OverloadedError as exc:
            raise HttpError(429 if "capacity" in str(exc) else 503, str(exc), exc.retry_after) from None
        response = decoded.response_class()
        if result.rejected:
            setattr(response.partial_success, _REJECTED_FIELD[decoded.signal], result.rejected)
            response.partial_success.error_message = result.message
        content_type, payload = encode_response(decoded, response)
        return web.Response(status=200, body=payload, content_type=content_type)

    async def _config(self, body: bytes) -> web.Response:
        try:
            payload = json.loads(body)
            experiment, backends = payload["experiment"], payload["backends"]
            if not isinstance(experiment, str) or not isinstance(backends, dict):
                raise TypeError("experiment must be a string and backends an object")
            if not all(isinstance(v, dict) for v in backends.values()):
                raise TypeError("each backend's options must be an object")
        except (ValueError, KeyError, TypeError) as exc:
            raise HttpError(400, f"bad config body: {exc}") from None
        answer = self.sink.configure(experiment, backends)
        return web.json_response({"result": answer})

    async def _get(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.path == "/healthz":
            healthy, problems = self.sink.health()
            text = "ok\n" if healthy else "".join(f"{p}\n" for p in problems)
            return web.Response(status=200 if healthy else 503, text=text)
        if request.path == "/rankscope/v1/status":
            self._auth(request)
            query = parse_qs(request.query_string)
            experiment = query.get("experiment", [None])[0]
            if experiment is None:
                return web.json_response(self.sink.overview())
            found = self.sink.status(experiment, _run(query))
            if found is None:
                raise HttpError(404, f"no experiment {experiment[:200]!r}; GET /rankscope/v1/status lists them")
            return web.json_response(found)
        if request.path == "/rankscope/v1/spans":
            self._auth(request)
            return await self._spans(request)
        if request.path == "/rankscope/v1/recent":
            self._auth(request)
            query = parse_qs(request.query_string)
            experiment = query.get("experiment", [""])[0]
            found = await self._call(self.sink.recent, experiment, _run(query))
            if found is None:
                raise HttpError(404, f"no experiment {experiment[:200]!r}")
            return web.json_response(found)
        if request.path == "/rankscope/v1/captures":
            self._auth(request)
            query = parse_qs(request.query_string)
            experiment, process = query.get("experiment", [""])[0], query.get("process", [""])[0]
            return web.json_response(await self._call(self.sink.pending_captures, experiment, process))
        raise HttpError(404, f"nothing at {request.path[:200]!r}")

    async def _report(self, body: bytes) -> web.Response:
        try:
            payload = json.loads(body)
            experiment, run = payload["experiment"], payload.get("run")
            if not isinstance(experiment, str) or not isinstance(run, (str, type(None))):
                raise TypeError("experiment (and run) must be strings")
        except (ValueError, KeyError, TypeError) as exc:
            raise HttpError(400, f"bad report request: {exc}") from None
        with self._report_lock:  # one page at a time per experiment; others' pages go on
            busy = experiment in self._reporting or len(self._reporting) >= 8
            if not busy:
                self._reporting.add(experiment)
        if busy:
            raise HttpError(429, "this experiment's report (or 8 others) is being written; ask again", 2)
        try:  # its own thread: waiting on the views never holds the pool that decodes data
            answer = await asyncio.to_thread(self.sink.report, experiment, REPORT_TIMEOUT, run)
        finally:
            with self._report_lock:
                self._reporting.discard(experiment)
        if isinstance(answer, str):
            raise HttpError(404 if answer.startswith("no experiment") else 409, answer)
        return web.json_response({"experiment": experiment, "reports": answer})

    async def _capture(self, body: bytes) -> web.Response:
        try:
            payload = json.loads(body)
            experiment, steps = payload["experiment"], payload.get("steps", 2)
            ranks, run = payload.get("ranks"), payload.get("run")
            reason = str(payload.get("reason") or "asked")
            if not isinstance(experiment, str) or isinstance(steps, bool) or not isinstance(steps, int):
                raise TypeError("experiment must be a string and steps an int")
            if not isinstance(run, (str, type(None))):
                raise TypeError("run must be a string")
            if ranks is not None and not (isinstance(ranks, list) and all(type(r) is int for r in ranks)):
                raise TypeError("ranks must be a list of ints")
        except (ValueError, KeyError, TypeError) as exc:
            raise HttpError(400, f"bad capture request: {exc}") from None
        chosen = None if ranks is None else frozenset(ranks)
        answer = await self._call(self.sink.capture, experiment, reason, steps, chosen, run)
        if isinstance(answer, str):
            raise HttpError(404 if answer.startswith("no experiment") else 429, answer)
        return web.json_response(answer)

    async def _capture_file(self, request: web.BaseRequest) -> web.Response:
        self._auth(request)
        query = parse_qs(request.query_string)
        experiment, capture, process = (query.get(k, [""])[0] for k in ("experiment", "capture", "process"))
        if request.content_length is None:
            raise HttpError(411, "a capture file needs a Content-Length")
        try:  # before the body is read: a file nobody asked for costs nothing
            await self._call(self.sink.capture_target, experiment, capture, process, request.content_length)
            body = await self._body(request)
            path = await self._call(self.sink.store_capture, experiment, capture, process, body)
        except LookupError as exc:
            raise HttpError(404, str(exc)) from None
        except OverloadedError as exc:
            raise HttpError(429, str(exc), exc.retry_after) from None
        return web.json_response({"path": path})

    async def _spans(self, request: web.BaseRequest) -> web.StreamResponse:
        query = parse_qs(request.query_string)
        experiment = query.get("experiment", [""])[0]
        try:
            first = int(query["first"][0]) if "first" in query else None
            last = int(query["last"][0]) if "last" in query else None
            ranks = parse_ranks(query.get("ranks", [""])[0])
        except ValueError as exc:
            raise HttpError(400, f"bad span query: {exc}") from None
        rows = await self._call(self.sink.span_rows, experiment, first, last, ranks, _run(query))
        if rows is None:
            raise HttpError(404, f"no experiment {experiment[:200]!r}")
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/x-ndjson"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        while chunk := await self._call(lambda: list(itertools.islice(rows, 1000))):
            await response.write("".join(chunk).encode())
        await response.write_eof()
        return response


def _error(request: web.BaseRequest, error: HttpError) -> web.Response:
    json_body = media_type(request.headers.get("Content-Type")) == "application/json"
    content_type, body = encode_status(error.message, _GRPC_CODES.get(error.status, 2), json_body)
    headers = {"Retry-After": str(error.retry_after)} if error.retry_after is not None else {}
    response = web.Response(status=error.status, body=body, content_type=content_type, headers=headers)
    if error.status in (401, 413):
        response.force_close()  # the unread body (or an unauthenticated peer) does not keep the connection
    return response


class HttpServer:
    """The aiohttp server on its own event-loop thread (supervised by the sink)."""

    def __init__(self, sink: Sink, host: str, port: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="rankscope-sink-http")
        routes = _Routes(sink, self.pool)
        config = sink.config
        server = _CappedServer(
            routes.handle,
            loop=self.loop,
            keepalive_timeout=config.idle_connection_timeout,
            access_log=None,
            auto_decompress=False,  # bodies.decompress inflates with the size cap
        )
        server.max_connections = config.max_connections
        self.runner = web.ServerRunner(server, handle_signals=False, access_log=None)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, host, port, backlog=1024, reuse_address=True)
        self.loop.run_until_complete(site.start())
        self.port = int(self.runner.addresses[0][1])
        self._stopped = threading.Event()

    def serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()
        self.loop.run_until_complete(self.runner.cleanup())
        self.loop.close()
        self._stopped.set()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._stopped.wait(5.0)
        self.pool.shutdown(wait=False, cancel_futures=True)


def start_http(sink: Sink, host: str, port: int) -> tuple[HttpServer, int]:
    server = HttpServer(sink, host, port)
    sink._spawn("http", server.serve)
    return server, server.port


def _run(query: dict[str, list[str]]) -> str | None:
    """The ``run`` a route asks for; absent: the experiment's latest run."""
    return query.get("run", [None])[0]
