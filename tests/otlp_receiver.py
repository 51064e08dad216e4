"""A real OTLP metrics receiver for tests: gRPC and HTTP/protobuf on ephemeral loopback ports.

It answers as OTLP requires (an ``ExportMetricsServiceResponse``) and keeps every request,
so tests assert on exactly what went over the wire.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc

from rankscope.otlp.metrics import DecodedPoint, decode

Request = metrics_service_pb2.ExportMetricsServiceRequest


class _Store:
    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.arrived: list[int] = []
        """When each request arrived (``time.time_ns()``), in the order of ``requests``."""
        self._cond = threading.Condition()

    def add(self, request: Any) -> None:
        with self._cond:
            self.requests.append(request)
            self.arrived.append(time.time_ns())
            self._cond.notify_all()

    def points(self) -> list[DecodedPoint]:
        with self._cond:
            requests = list(self.requests)
        return [p for r in requests for p in decode(r)]

    def wait_for(self, predicate: Callable[[list[DecodedPoint]], bool], timeout: float = 20.0) -> list[DecodedPoint]:
        deadline = time.monotonic() + timeout
        while True:
            points = self.points()
            if predicate(points):
                return points
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"receiver: condition not met in {timeout}s; got {len(points)} points")
            with self._cond:
                self._cond.wait(min(remaining, 0.1))


class _Servicer(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, store: GrpcReceiver) -> None:
        self.store = store

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC method name
        store = self.store
        store.add(request)
        if store.first_answer_delay and store.answered_late is None:  # a slow endpoint, once
            time.sleep(store.first_answer_delay)
            store.answered_late = time.time_ns()
        return metrics_service_pb2.ExportMetricsServiceResponse()


class GrpcReceiver(_Store):
    def __init__(self, first_answer_delay: float = 0.0) -> None:
        super().__init__()
        self.first_answer_delay = first_answer_delay
        """Seconds the first request's answer waits (kept, then answered late)."""
        self.answered_late: int | None = None
        """When that answer went (``time.time_ns()``)."""
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_Servicer(self), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"127.0.0.1:{self.port}"
        self.server.start()

    def close(self) -> None:
        self.server.stop(grace=None).wait(5)


class HttpReceiver(_Store):
    def __init__(self) -> None:
        super().__init__()
        store = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path != "/v1/metrics" or self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_response(415 if self.path == "/v1/metrics" else 404)
                    self.end_headers()
                    return
                if self.headers.get("Content-Encoding") == "gzip":
                    import gzip

                    body = gzip.decompress(body)
                request = Request()
                request.ParseFromString(body)
                store.add(request)
                payload = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
