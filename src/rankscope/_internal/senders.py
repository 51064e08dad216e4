"""Where a process's OTLP goes: the SDK's own exporters, fed with ready protobuf requests.

rankscope builds the OTLP protobuf itself (its states are already aggregated, and the
SDK's dataclass round trip costs ~5x more on the export thread), then hands the request
to the SDK exporter's protobuf-level entry point, so endpoint, headers, TLS, compression,
timeouts and retries follow the SDK and its ``OTEL_EXPORTER_OTLP_*`` variables.

Metrics go as metrics; streamed raw values (``per_rank_no_reduce`` views in the sink) go
as OTLP log records. ``EmbeddedSenders`` finds or starts the experiment's embedded sink the
first time it has something to send, on the export thread, never on the caller's.
"""

from __future__ import annotations

import json
import os
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.sdk._logs.export import LogRecordExportResult
from opentelemetry.sdk.metrics.export import MetricExportResult
from opentelemetry.sdk.trace.export import SpanExportResult


def _points(request: Any) -> int:
    return sum(len(m.ListFields()) for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics)


class _GrpcMetrics(GrpcMetricExporter):
    """The SDK gRPC exporter fed with a ready request (its ``_export`` retry loop is reused)."""

    def _translate_data(self, data: Any) -> Any:
        return data

    def _count_data(self, data: Any) -> int:
        return _points(data)

    def send(self, request: Any) -> bool:
        return self._export(data=request) is MetricExportResult.SUCCESS  # type: ignore[arg-type]


class _HttpMetrics(HttpMetricExporter):
    def send(self, request: Any) -> bool:
        if self._shutdown:
            return False
        return self._export_batch(request) is MetricExportResult.SUCCESS


class _GrpcLogs(GrpcLogExporter):
    def _translate_data(self, data: Any) -> Any:
        return data

    def _count_data(self, data: Any) -> int:
        return sum(len(sl.log_records) for rl in data.resource_logs for sl in rl.scope_logs)

    def send(self, request: Any) -> bool:
        return self._export(data=request) is LogRecordExportResult.SUCCESS  # type: ignore[arg-type]


class _HttpLogs(HttpLogExporter):
    def send(self, request: Any) -> bool:
        if self._shutdown:
            return False
        return bool(self._client.export(request.SerializeToString()).success)


class _GrpcSpans(GrpcSpanExporter):
    def _translate_data(self, data: Any) -> Any:
        return data

    def _count_data(self, data: Any) -> int:
        return sum(len(ss.spans) for rs in data.resource_spans for ss in rs.scope_spans)

    def send(self, request: Any) -> bool:
        return self._export(data=request) is SpanExportResult.SUCCESS  # type: ignore[arg-type]


class _HttpSpans(HttpSpanExporter):
    def send(self, request: Any) -> bool:
        if self._shutdown:
            return False
        return bool(self._client.export(request.SerializeToString()).success)


def _url(endpoint: str | None) -> str | None:
    if endpoint is not None and "://" not in endpoint:
        return f"http://{endpoint}"  # a bare host:port means plaintext; say https:// for TLS
    return endpoint


def has_endpoint(endpoint: str | None) -> bool:
    return endpoint is not None or bool(
        os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


class Senders:
    """The metric and span senders and (when values are streamed) the log sender of one process."""

    def __init__(self, endpoint: str | None, protocol: str, stream: bool) -> None:
        url = _url(endpoint)
        self._spans: Any = None
        self._protocol, self._url = protocol, url
        if protocol == "http/protobuf":
            base = None if url is None else url.rstrip("/").removesuffix("/v1/metrics")
            self._base = base
            self.metrics: Any = _HttpMetrics(endpoint=None if base is None else f"{base}/v1/metrics")
            self.logs: Any = _HttpLogs(endpoint=None if base is None else f"{base}/v1/logs") if stream else None
        else:
            self.metrics = _GrpcMetrics(endpoint=url)
            self.logs = _GrpcLogs(endpoint=url) if stream else None

    def send_spans(self, request: Any) -> bool:
        if self._spans is None:  # made on first use: most processes of a metrics-only job never trace
            if self._protocol == "http/protobuf":
                self._spans = _HttpSpans(endpoint=None if self._base is None else f"{self._base}/v1/traces")
            else:
                self._spans = _GrpcSpans(endpoint=self._url)
        return bool(self._spans.send(request))

    def send(self, request: Any) -> bool:
        return bool(self.metrics.send(request))

    def send_logs(self, request: Any) -> bool:
        return self.logs is None or bool(self.logs.send(request))

    def shutdown(self, timeout_millis: float = 30_000) -> None:
        self.metrics.shutdown(timeout_millis=timeout_millis)
        if self.logs is not None:
            self.logs.shutdown()
        if self._spans is not None:
            self._spans.shutdown()


class EmbeddedSenders:
    """Senders that connect to the experiment's embedded sink on first use."""

    def __init__(self, connect: Callable[[], tuple[str, str]], protocol: str, stream: bool) -> None:
        self._connect = connect
        self._protocol = protocol
        self._stream = stream
        self._inner: Senders | None = None
        self._failed = False
        self.control_url: str | None = None

    def _ready(self) -> Senders | None:
        if self._inner is None and not self._failed:
            try:
                endpoint, self.control_url = self._connect()
            except Exception:
                self._failed = True  # counted as dropped by the caller; the job goes on
                raise
            self._inner = Senders(endpoint or None, self._protocol, self._stream)
        return self._inner

    def send(self, request: Any) -> bool:
        inner = self._ready()
        return inner is not None and inner.send(request)

    def send_logs(self, request: Any) -> bool:
        inner = self._ready()
        return inner is not None and inner.send_logs(request)

    def send_spans(self, request: Any) -> bool:
        inner = self._ready()
        return inner is not None and inner.send_spans(request)

    def shutdown(self, timeout_millis: float = 30_000) -> None:
        if self._inner is not None:
            self._inner.shutdown(timeout_millis)


def sink_status(control_url: str, experiment: str, timeout: float = 2.0) -> dict[str, Any] | None:
    url = f"{control_url.rstrip('/')}/rankscope/v1/status?{urllib.parse.urlencode({'experiment': experiment})}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            found = json.loads(response.read())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def post_config(control_url: str, experiment: str, backends: Mapping[str, Any], timeout: float = 5.0) -> str:
    """Tell a rankscope sink which views this experiment wants (the first config wins)."""
    body = json.dumps({"experiment": experiment, "backends": backends}).encode()
    request = urllib.request.Request(
        control_url.rstrip("/") + "/rankscope/v1/config",
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return str(json.loads(response.read()).get("result"))
