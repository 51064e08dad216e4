"""The OpenTelemetry private names rankscope relies on (``export._otel_sdk``): each resolves, each
exporter path carries a request to a real receiver and takes a busy one's retry hint, and a missing
or changed one is a clear error at init."""

from __future__ import annotations

import gzip
import re
import threading
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import opentelemetry.sdk.metrics as sdk_metrics
import pytest
from google.protobuf.duration_pb2 import Duration
from google.rpc.error_details_pb2 import RetryInfo
from opentelemetry.exporter.http.transport._base import BaseHTTPResult, BaseHTTPTransport
from opentelemetry.exporter.otlp.common.http import _OTLPHTTPClient
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.metrics.v1.metrics_pb2 import Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from opentelemetry.sdk._configuration import _BaseConfigurator

import rankscope as rs
from rankscope.core import errors as rs_errors
from rankscope.export import _otel_sdk
from rankscope.export.senders import SENT, Sender, make_sender

SIGNALS: dict[str, tuple[Any, Any, Any, Any, str]] = {
    "metrics": (
        metrics_service_pb2.ExportMetricsServiceRequest,
        metrics_service_pb2.ExportMetricsServiceResponse,
        metrics_service_pb2_grpc.MetricsServiceServicer,
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server,
        "/v1/metrics",
    ),
    "logs": (
        logs_service_pb2.ExportLogsServiceRequest,
        logs_service_pb2.ExportLogsServiceResponse,
        logs_service_pb2_grpc.LogsServiceServicer,
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server,
        "/v1/logs",
    ),
    "spans": (
        trace_service_pb2.ExportTraceServiceRequest,
        trace_service_pb2.ExportTraceServiceResponse,
        trace_service_pb2_grpc.TraceServiceServicer,
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server,
        "/v1/traces",
    ),
}
RETRY_AFTER = 7.0


class Receiver:
    """OTLP metrics, logs and traces over gRPC and HTTP/protobuf on ephemeral loopback ports.

    Keeps every request it takes as (protocol, signal, request); ``refuse`` answers as a busy
    endpoint does (gRPC UNAVAILABLE with RetryInfo, HTTP 503 with Retry-After).
    """

    def __init__(self, refuse: bool = False) -> None:
        self.got: list[tuple[str, str, Any]] = []
        self.encodings: set[str | None] = set()
        self.refuse = refuse
        self._lock = threading.Lock()
        self.grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        for signal, (_, response, servicer, add, _) in SIGNALS.items():
            add(self._servicer(signal, servicer, response), self.grpc_server)
        self.grpc_endpoint = f"127.0.0.1:{self.grpc_server.add_insecure_port('127.0.0.1:0')}"
        self.grpc_server.start()
        self.http_server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.http_endpoint = f"http://127.0.0.1:{self.http_server.server_address[1]}"
        threading.Thread(target=self.http_server.serve_forever, daemon=True).start()

    def _take(self, protocol: str, signal: str, request: Any) -> None:
        with self._lock:
            self.got.append((protocol, signal, request))

    def _servicer(self, signal: str, base: Any, response: Any) -> Any:
        receiver = self

        class Servicer(base):  # type: ignore[misc,valid-type]
            def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - the gRPC method
                if receiver.refuse:
                    hint = RetryInfo(retry_delay=Duration(seconds=int(RETRY_AFTER)))
                    context.set_trailing_metadata((("google.rpc.retryinfo-bin", hint.SerializeToString()),))
                    context.abort(grpc.StatusCode.UNAVAILABLE, "busy")
                receiver._take("grpc", signal, request)
                return response()

        return Servicer()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self
        by_path = {path: (signal, request, response) for signal, (request, response, _, _, path) in SIGNALS.items()}

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if receiver.refuse:
                    self.send_response(503)
                    self.send_header("Retry-After", str(int(RETRY_AFTER)))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                signal, request_class, response_class = by_path[self.path]
                assert self.headers.get("Content-Type") == "application/x-protobuf"
                receiver.encodings.add(self.headers.get("Content-Encoding"))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = request_class()
                request.ParseFromString(body)
                receiver._take("http/protobuf", signal, request)
                payload = response_class().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        return Handler

    def endpoint(self, protocol: str) -> str:
        return self.grpc_endpoint if protocol == "grpc" else self.http_endpoint

    def close(self) -> None:
        self.grpc_server.stop(grace=None).wait(5)
        self.http_server.shutdown()
        self.http_server.server_close()


@pytest.fixture
def otlp() -> Iterator[Receiver]:
    receiver = Receiver()
    yield receiver
    rs.shutdown()
    receiver.close()


def _requests() -> dict[str, Any]:
    point = NumberDataPoint(as_double=1.5, time_unix_nano=1)
    metric = Metric(name="smoke", gauge=Gauge(data_points=[point]))
    log = LogRecord(body=AnyValue(string_value="smoke"), time_unix_nano=1)
    span = Span(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="smoke", start_time_unix_nano=1, end_time_unix_nano=2)
    return {
        "metrics": SIGNALS["metrics"][0](
            resource_metrics=[ResourceMetrics(scope_metrics=[ScopeMetrics(metrics=[metric])])]
        ),
        "logs": SIGNALS["logs"][0](resource_logs=[ResourceLogs(scope_logs=[ScopeLogs(log_records=[log])])]),
        "spans": SIGNALS["spans"][0](resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[span])])]),
    }


def _send_all(sender: Sender) -> dict[str, Any]:
    requests = _requests()
    sent = {  # senders take serialized requests (the export thread encodes them)
        "metrics": sender.send("metrics", requests["metrics"].SerializeToString(), 5.0),
        "logs": sender.send("logs", requests["logs"].SerializeToString(), 5.0),
        "spans": sender.send("spans", requests["spans"].SerializeToString(), 5.0),
    }
    return {"requests": requests, "sent": sent}


def test_every_private_name_resolves_in_the_installed_versions() -> None:
    found, problems = _otel_sdk.check()
    assert problems == [] and _otel_sdk.PROBLEMS == []
    assert _otel_sdk.SdkGauge is sdk_metrics._Gauge
    assert _otel_sdk.ConfiguratorBase is _BaseConfigurator
    assert _otel_sdk.HttpTransportBase is BaseHTTPTransport and _otel_sdk.HttpResultBase is BaseHTTPResult
    assert set(found) == {"gauge", "receive", "configurator", "grpc logs", "http logs", "http transport", "http result"}
    for protocol in ("grpc", "http/protobuf"):
        for signal in ("metrics", "logs", "spans"):
            exporter = _otel_sdk.make_exporter(protocol, signal, endpoint="http://127.0.0.1:9/x")  # type: ignore[arg-type]
            exporter.shutdown()


@pytest.mark.parametrize(
    ("protocol", "compression"), [("grpc", None), ("http/protobuf", None), ("http/protobuf", "gzip")]
)
def test_each_exporter_path_carries_one_request_to_a_real_receiver(
    otlp: Receiver, protocol: str, compression: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if compression is not None:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", compression)
    senders = make_sender(otlp.endpoint(protocol), protocol)
    try:
        result = _send_all(senders)
    finally:
        senders.shutdown()
    assert result["sent"] == {"metrics": SENT, "logs": SENT, "spans": SENT}
    assert otlp.got == [(protocol, signal, request) for signal, request in result["requests"].items()]
    assert otlp.encodings == (set() if protocol == "grpc" else {compression})  # the client's own _compress


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_busy_receiver_is_retried_after_its_own_hint(protocol: str) -> None:
    busy = Receiver(refuse=True)
    senders = make_sender(busy.endpoint(protocol), protocol)
    try:
        result = _send_all(senders)
    finally:
        senders.shutdown()
        busy.close()
    for attempt in result["sent"].values():
        assert not attempt.sent and attempt.retry and attempt.retry_after == RETRY_AFTER, attempt


def test_a_missing_name_on_a_module_is_reported_at_init(otlp: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(sdk_metrics, "_Gauge")
    _, problems = _otel_sdk.check()
    (problem,) = problems
    assert problem.startswith(
        f"opentelemetry-sdk {_otel_sdk.installed('opentelemetry-sdk')} has no opentelemetry.sdk.metrics._Gauge "
        "(rankscope read it from 1.45.2); synchronous gauges"
    )
    monkeypatch.setattr(_otel_sdk, "PROBLEMS", problems)
    monkeypatch.setattr(_otel_sdk, "_reported", False)
    with pytest.warns(RuntimeWarning, match=re.escape(problem)):
        rs.init(experiment="otel-compat", endpoint=otlp.grpc_endpoint)
    assert len(rs_errors.internal_errors) == 1 and problem in rs_errors.internal_errors[0]
    rs_errors.internal_errors.clear()


def test_a_missing_exporter_attribute_is_a_clear_error_at_init_not_dropped_points(
    otlp: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = GrpcMetricExporter.__init__

    def renamed(self: Any, *args: Any, **kwargs: Any) -> None:  # a release that renamed _headers
        made(self, *args, **kwargs)
        self._metadata = self.__dict__.pop("_headers")

    monkeypatch.setattr(GrpcMetricExporter, "__init__", renamed)
    expected = (
        f"opentelemetry-exporter-otlp-proto-grpc {_otel_sdk.installed(_otel_sdk.GRPC)} has no OTLPMetricExporter()."
        "_headers (rankscope read it from 1.45.2); OTLP metrics cannot be sent over grpc"
    )
    with pytest.warns(RuntimeWarning, match=re.escape(expected)):
        rs.init(experiment="otel-compat", endpoint=otlp.grpc_endpoint)
    assert len(rs_errors.internal_errors) == 1 and expected in rs_errors.internal_errors[0]
    senders = make_sender(otlp.grpc_endpoint, "grpc")  # what the export thread sends through
    refused = senders.send("metrics", _requests()["metrics"].SerializeToString(), 5.0)
    assert not refused.sent and not refused.retry and refused.detail.startswith(expected)
    rs_errors.internal_errors.clear()


def test_a_changed_http_client_method_is_a_clear_error(otlp: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    def submit(self: Any, request: Any) -> Any:  # a release whose client builds its own request
        raise AssertionError("never called")

    monkeypatch.setattr(_OTLPHTTPClient, "_submit", submit)
    expected = (
        f"opentelemetry-exporter-otlp-common {_otel_sdk.installed(_otel_sdk.HTTP_CLIENT)} has no "
        "_OTLPHTTPClient._submit(data, timeout) (rankscope read it from 0.66b2)"
    )
    with pytest.warns(RuntimeWarning, match=re.escape(expected)):
        senders = make_sender(otlp.http_endpoint, "http/protobuf")
    result = _send_all(senders)
    senders.shutdown()
    for attempt in result["sent"].values():
        assert not attempt.sent and not attempt.retry and attempt.detail.startswith(expected)
    assert otlp.got == []
    assert len(rs_errors.internal_errors) == 3  # one per signal: metrics, logs, spans
    rs_errors.internal_errors.clear()
