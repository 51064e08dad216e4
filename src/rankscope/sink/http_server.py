"""OTLP/HTTP transport on the standard library's threading HTTP server.

Routes: ``POST /v1/metrics|traces|logs`` (OTLP, protobuf or JSON, optionally gzip),
``GET /healthz``, and two control routes for embedded clients: ``POST /rankscope/v1/config``
(an experiment's views) and ``GET /rankscope/v1/status?experiment=ID``, and
``GET /rankscope/v1/spans?experiment=ID[&first=N][&last=M][&ranks=0,2-3]``: stored spans as
JSONL, streamed in chunks (what ``rankscope gantt --sink`` reads).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from .bodies import HttpError, decode_body, encode_response, encode_status, media_type
from .service import OverloadedError
from .traces import parse_ranks

if TYPE_CHECKING:
    from .service import Sink

_GRPC_CODES = {400: 3, 401: 16, 404: 5, 411: 3, 413: 8, 415: 3, 429: 8, 503: 14}


class _Handler(BaseHTTPRequestHandler):
    server_version = "rankscope-sink"
    protocol_version = "HTTP/1.1"
    sink: Sink

    def log_message(self, format: str, *args: Any) -> None:
        pass  # no access log on stderr

    def _send(self, status: int, content_type: str, body: bytes, retry_after: int | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if retry_after is not None:
            self.send_header("Retry-After", str(retry_after))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _error(self, error: HttpError) -> None:
        json_body = media_type(self.headers.get("Content-Type")) == "application/json"
        content_type, body = encode_status(error.message, _GRPC_CODES.get(error.status, 2), json_body)
        self._send(error.status, content_type, body, error.retry_after)

    def _authorized(self) -> bool:
        token = self.sink.config.token
        return token is None or self.headers.get("Authorization", "") == f"Bearer {token}"

    def _read_body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None or not length.strip().isdigit():
            self.close_connection = True
            raise HttpError(411, "a Content-Length header is required")
        size = int(length)
        if size > self.sink.config.max_body_bytes:
            self.close_connection = True  # do not read it: the connection is closed instead
            raise HttpError(413, f"body of {size} bytes exceeds the {self.sink.config.max_body_bytes}-byte limit")
        return self.rfile.read(size)

    def do_POST(self) -> None:
        try:
            if not self._authorized():
                self.close_connection = True
                raise HttpError(401, "missing or wrong bearer token")
            body = self._read_body()
            path = urlsplit(self.path).path
            if path == "/rankscope/v1/config":
                self._config(body)
                return
            decoded = decode_body(
                path,
                self.headers.get("Content-Type"),
                self.headers.get("Content-Encoding"),
                body,
                self.sink.config.max_body_bytes,
            )
            export = {
                "metrics": self.sink.export_metrics,
                "traces": self.sink.export_traces,
                "logs": self.sink.export_logs,
            }[decoded.signal]
            try:
                result = export(decoded.request)
            except OverloadedError as exc:
                raise HttpError(429 if "capacity" in str(exc) else 503, str(exc), exc.retry_after) from None
            response = decoded.response_class()
            if result.rejected:
                field = {"metrics": "rejected_data_points", "traces": "rejected_spans", "logs": "rejected_log_records"}
                setattr(response.partial_success, field[decoded.signal], result.rejected)  # type: ignore[attr-defined]
                response.partial_success.error_message = result.message  # type: ignore[attr-defined]
            self._send(200, *encode_response(decoded, response))
        except HttpError as error:
            self._error(error)

    def _config(self, body: bytes) -> None:
        try:
            payload = json.loads(body)
            experiment, backends = payload["experiment"], payload["backends"]
            if not isinstance(experiment, str) or not isinstance(backends, dict):
                raise TypeError("experiment must be a string and backends an object")
        except (ValueError, KeyError, TypeError) as exc:
            raise HttpError(400, f"bad config body: {exc}") from None
        answer = self.sink.configure(experiment, backends)
        self._send(200, "application/json", json.dumps({"result": answer}).encode())

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/healthz":
            self._send(200, "text/plain", b"ok\n")
            return
        if url.path == "/rankscope/v1/status":
            if not self._authorized():
                self._error(HttpError(401, "missing or wrong bearer token"))
                return
            experiment = parse_qs(url.query).get("experiment", [""])[0]
            found = self.sink.status(experiment)
            if found is None:
                self._error(HttpError(404, f"no experiment {experiment!r}"))
            else:
                self._send(200, "application/json", json.dumps(found).encode())
            return
        if url.path == "/rankscope/v1/spans":
            if not self._authorized():
                self._error(HttpError(401, "missing or wrong bearer token"))
                return
            self._spans(parse_qs(url.query))
            return
        self._error(HttpError(404, f"nothing at {url.path!r}"))

    def _spans(self, query: dict[str, list[str]]) -> None:
        experiment = query.get("experiment", [""])[0]
        try:
            first = int(query["first"][0]) if "first" in query else None
            last = int(query["last"][0]) if "last" in query else None
            ranks = parse_ranks(query.get("ranks", [""])[0])
        except ValueError as exc:
            self._error(HttpError(400, f"bad span query: {exc}"))
            return
        found = self.sink.spans(experiment, first, last, ranks)
        if found is None:
            self._error(HttpError(404, f"no experiment {experiment!r}"))
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for start in range(0, len(found), 1000):
            chunk = "".join(json.dumps(span.row()) + "\n" for span in found[start : start + 1000]).encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        self.wfile.write(b"0\r\n\r\n")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def start_http(sink: Sink, host: str, port: int) -> tuple[Any, int]:
    handler = type("Handler", (_Handler,), {"sink": sink})
    server = _Server((host, port), handler)
    thread = threading.Thread(target=server.serve_forever, name="rankscope-sink-http", daemon=True)
    thread.start()
    return _Stoppable(server, thread), server.server_address[1]


class _Stoppable:
    def __init__(self, server: _Server, thread: threading.Thread) -> None:
        self.server, self.thread = server, thread

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(2.0)
