"""OTLP/gRPC transport: the three collector services on grpcio, handing requests to the sink.

grpcio inflates gzip itself and enforces ``max_receive_message_length`` on the inflated
message, so oversized and gzip-bomb requests end as RESOURCE_EXHAUSTED before we see them.
Overload answers UNAVAILABLE, which OTLP clients retry with backoff.
"""

from __future__ import annotations

from concurrent import futures
from typing import TYPE_CHECKING, Any

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2 as logs_pb
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc as logs_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as metrics_pb
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as metrics_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as trace_pb
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as trace_grpc

from .service import OverloadedError, Result

if TYPE_CHECKING:
    from .service import Sink


def _call(sink: Sink, context: Any, export: Any, request: Any) -> Result:
    token = sink.config.token
    if token is not None:
        sent = dict(context.invocation_metadata()).get("authorization", "")
        if sent != f"Bearer {token}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
    try:
        return export(request)  # type: ignore[no-any-return]
    except OverloadedError as exc:
        context.set_trailing_metadata((("retry-after", str(exc.retry_after)),))
        context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        raise  # unreachable: abort raises


class _Metrics(metrics_grpc.MetricsServiceServicer):
    def __init__(self, sink: Sink) -> None:
        self.sink = sink

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC method name
        r = _call(self.sink, context, self.sink.export_metrics, request)
        response = metrics_pb.ExportMetricsServiceResponse()
        if r.rejected:
            response.partial_success.rejected_data_points = r.rejected
            response.partial_success.error_message = r.message
        return response


class _Traces(trace_grpc.TraceServiceServicer):
    def __init__(self, sink: Sink) -> None:
        self.sink = sink

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802
        r = _call(self.sink, context, self.sink.export_traces, request)
        response = trace_pb.ExportTraceServiceResponse()
        if r.rejected:
            response.partial_success.rejected_spans = r.rejected
            response.partial_success.error_message = r.message
        return response


class _Logs(logs_grpc.LogsServiceServicer):
    def __init__(self, sink: Sink) -> None:
        self.sink = sink

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802
        r = _call(self.sink, context, self.sink.export_logs, request)
        response = logs_pb.ExportLogsServiceResponse()
        if r.rejected:
            response.partial_success.rejected_log_records = r.rejected
            response.partial_success.error_message = r.message
        return response


def start_grpc(sink: Sink, host: str, port: int) -> tuple[Any, int]:
    limit = sink.config.max_body_bytes
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=sink.config.grpc_workers, thread_name_prefix="rankscope-sink-grpc"),
        options=[("grpc.max_receive_message_length", limit), ("grpc.so_reuseport", 0)],
    )
    metrics_grpc.add_MetricsServiceServicer_to_server(_Metrics(sink), server)
    trace_grpc.add_TraceServiceServicer_to_server(_Traces(sink), server)
    logs_grpc.add_LogsServiceServicer_to_server(_Logs(sink), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"rankscope sink: cannot listen for OTLP/gRPC on {host}:{port}")
    server.start()
    return _Stoppable(server), bound


class _Stoppable:
    def __init__(self, server: Any) -> None:
        self.server = server

    def stop(self) -> None:
        self.server.stop(grace=1.0).wait(2.0)
