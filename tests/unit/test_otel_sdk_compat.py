"""Only ``export._otel_sdk`` touches the OpenTelemetry SDK's private names (a source scan)."""

from __future__ import annotations

import re
from typing import Any

from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from ..conftest import ROOT

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






















_PRIVATE = re.compile(r"opentelemetry(\.\w+)*\._\w|from opentelemetry[\w.]* import[^\n]*\b_[A-Za-z]|_RUNTIME_CONTEXT")


def test_nothing_else_touches_opentelemetry_private_names() -> None:
    package = ROOT / "src" / "rankscope"
    touching = {p.relative_to(package).as_posix() for p in package.rglob("*.py") if _PRIVATE.search(p.read_text())}
    assert touching == {"export/_otel_sdk.py"}
