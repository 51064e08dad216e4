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


def _servicer(sink: Sink, base: type, export_name: str, response_class: type, rejected_field: str) -> Any:
    """A collector service instance whose Export hands the request to ``sink.<export_name>``."""
    sink_export = getattr(sink, export_name)

    def export(self: Any, request: Any, context: Any) -> Any:
        r = _call(sink, context, sink_export, request)
        response = response_class()
        if r.rejected:
            setattr(response.partial_success, rejected_field, r.rejected)
            response.partial_success.error_message = r.message
        return response

    return type(f"_{base.__name__}", (base,), {"Export": export})()


def start_grpc(sink: Sink, host: str, port: int) -> tuple[Any, int]:
    limit = sink.config.max_body_bytes
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=sink.config.grpc_workers, thread_name_prefix="rankscope-sink-grpc"),
        options=[("grpc.max_receive_message_length", limit), ("grpc.so_reuseport", 0)],
    )
    metrics = _servicer(
        sink,
        metrics_grpc.MetricsServiceServicer,
        "export_metrics",
        metrics_pb.ExportMetricsServiceResponse,
        "rejected_data_points",
    )
    traces = _servicer(
        sink, trace_grpc.TraceServiceServicer, "export_traces", trace_pb.ExportTraceServiceResponse, "rejected_spans"
    )
    logs = _servicer(
        sink, logs_grpc.LogsServiceServicer, "export_logs", logs_pb.ExportLogsServiceResponse, "rejected_log_records"
    )
    metrics_grpc.add_MetricsServiceServicer_to_server(metrics, server)
    trace_grpc.add_TraceServiceServicer_to_server(traces, server)
    logs_grpc.add_LogsServiceServicer_to_server(logs, server)
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
