"""The export thread: local backends and OTLP, off the caller's thread, bounded.

``flush`` puts a ``StepBatch`` on a bounded queue and returns. This thread reads device
values (waiting on CUDA events here, never on the caller), hands reduced values to the
local backends, and sends every queued step in one OTLP request through the OTel SDK's
exporter. Points that cannot be queued or exported are counted; once an export succeeds
again the count is reported in a warning and in the ``rankscope.dropped_points`` metric.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import queue
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, MetricReader, MetricsData
from opentelemetry.sdk.resources import Resource

from .._version import __version__
from . import attributes as attr
from .backends.base import LoggerBackend, LoggingMode, Metric
from .collector import Collector, StepBatch
from .reduce import Reduce, reduced_items
from .senders import EmbeddedSenders, Senders
from .spans import SpanBuffer, encode_spans
from .wire import PointAttributes, encode, encode_resource, key_value

_STREAM_QUEUE_LIMIT = 65536
_MAX_ITEMS_PER_ROUND = 256
_MAX_SPANS_PER_REQUEST = 4096
_MIN_EXPORT_GAP = 0.1
"""Seconds between OTLP requests of one process: steps flushed faster than this share a
request (a 20 ms training step would otherwise pay a gRPC call per step)."""


def _warn(message: str) -> None:
    """A RuntimeWarning that cannot take the export thread down, even under ``-W error``."""
    try:
        warnings.warn(message, RuntimeWarning, stacklevel=3)
    except Warning:
        logging.getLogger("rankscope").warning(message)


class _PullReader(MetricReader):
    """Collects the MeterProvider's own instruments when the export thread asks (delta)."""

    def __init__(self) -> None:
        super().__init__(preferred_temporality=dict.fromkeys(_INSTRUMENT_TYPES, AggregationTemporality.DELTA))
        self._data: MetricsData | None = None

    def _receive_metrics(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> None:
        self._data = metrics_data

    def pull(self) -> MetricsData | None:
        self.collect()
        data, self._data = self._data, None
        return data

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass


def _instrument_types() -> tuple[type, ...]:
    from opentelemetry.sdk.metrics import (
        Counter,
        Histogram,
        ObservableCounter,
        ObservableGauge,
        ObservableUpDownCounter,
        UpDownCounter,
    )
    from opentelemetry.sdk.metrics import _Gauge as Gauge

    return (Counter, UpDownCounter, Histogram, ObservableCounter, ObservableUpDownCounter, ObservableGauge, Gauge)


_INSTRUMENT_TYPES = _instrument_types()


class BackendSet:
    """The process's local backends; every call runs on the export thread."""

    def __init__(self, backends: list[LoggerBackend], init_kwargs: dict[str, Any], process_name: str) -> None:
        self.backends = backends
        self.reducing = [b for b in backends if b.logging_mode is not LoggingMode.PER_RANK_NO_REDUCE]
        self.streaming = [b for b in backends if b.logging_mode is LoggingMode.PER_RANK_NO_REDUCE]
        self._init_kwargs = init_kwargs
        self._process_name = process_name
        self._loop: asyncio.AbstractEventLoop | None = None

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result):  # Forge-style async backends
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(result)  # type: ignore[arg-type]

    def init(self) -> None:
        for backend in self.backends:
            self.call(backend.init, self._process_name, **self._init_kwargs)

    def log_batch(self, batch: StepBatch) -> None:
        if not self.reducing:
            return
        now = time.time()
        metrics = [
            Metric(name, value, acc.reduction_type, now)
            for key, acc in batch.accs.items()
            for name, value in reduced_items(key, acc.get_value())
        ]
        for backend in self.reducing:
            self.call(backend.log_batch, metrics, batch.step)

    def log_stream(self, metric: Metric, step: int | None) -> None:
        for backend in self.streaming:
            self.call(backend.log_stream, metric, step)

    def finish(self) -> None:
        for backend in self.backends:
            self.call(backend.finish)
        if self._loop is not None:
            self._loop.close()


class ExportThread:
    """Owns the bounded queue and the thread that drains it."""

    def __init__(
        self,
        *,
        resource: Resource,
        collector: Collector,
        backends: BackendSet,
        otlp: Senders | EmbeddedSenders | None,
        export_interval: float,
        max_queued_steps: int,
        periodic: Callable[[], bool],
        on_error: Callable[[str, BaseException], None],
        stream_to_sink: bool = False,
        spans: SpanBuffer | None = None,
    ) -> None:
        self.resource = resource
        self.spans = spans if spans is not None else SpanBuffer(1)
        self._spans_dropped_reported = 0
        self._spans_warned = False
        self.collector = collector
        self.backends = backends
        self.otlp = otlp
        self.export_interval = export_interval
        self.max_queued_steps = max_queued_steps
        self._periodic = periodic
        self._on_error = on_error
        self.stream_to_sink = stream_to_sink and otlp is not None
        self._streams: list[tuple[Metric, int | None]] = []
        self._resource_pb = encode_resource(resource.attributes)
        self._scope = InstrumentationScope(name=attr.INSTRUMENTATION_SCOPE, version=__version__)
        self._point_attributes = PointAttributes()
        self._reader = _PullReader()
        self.meter_provider = MeterProvider(resource=resource, metric_readers=[self._reader], shutdown_on_exit=False)
        meter = self.meter_provider.get_meter(attr.INSTRUMENTATION_SCOPE, __version__)
        self._dropped_counter = meter.create_counter(
            attr.DROPPED_POINTS, unit="{point}", description="points rankscope could not queue or export"
        )
        self._queue: queue.Queue[Any] = queue.Queue(_STREAM_QUEUE_LIMIT)
        self._queued_steps = 0
        self._lock = threading.Lock()
        self.dropped_total = 0
        self._dropped_unreported = 0
        self._warned_drop = False
        self._thread = threading.Thread(target=self._run, name="rankscope-export", daemon=True)
        self._thread.start()

    # -- caller side -------------------------------------------------------------------

    def submit(self, batch: StepBatch) -> None:
        with self._lock:
            full = self._queued_steps >= self.max_queued_steps
            if not full:
                self._queued_steps += 1
        if full or not self._put(("batch", batch)):
            self._drop(len(batch.accs), "the export queue is full")

    def stream(self, key: str, value: float, reduce: Reduce, when: float, step: int | None) -> None:
        if not self._put(("stream", Metric(key, value, reduce, when), step)):
            self._drop(1, "the export queue is full")

    def flush(self, timeout: float) -> bool:
        """Wait until everything queued before this call has been handled."""
        done = threading.Event()
        if not self._put(("sync", done)):
            return False
        return done.wait(timeout)

    def shutdown(self, timeout: float) -> None:
        self._put(("stop", None), block=True, timeout=timeout)
        self._thread.join(timeout)
        if self._thread.is_alive():
            # Stuck in an export retry: stop the exporter; whatever is left is lost.
            if self.otlp is not None:
                self.otlp.shutdown(timeout_millis=100)
            self._thread.join(1.0)
            left = sum(len(item[1].accs) for item in list(self._queue.queue) if item[0] == "batch")
            self._drop(left, f"shutdown did not finish exporting within {timeout:.1f}s")
            self._report_drops(final=True)
        elif self.otlp is not None:
            self.otlp.shutdown()
        self.meter_provider.shutdown()

    def _put(self, item: Any, block: bool = False, timeout: float | None = None) -> bool:
        try:
            self._queue.put(item, block=block, timeout=timeout)
            return True
        except queue.Full:
            return False

    def _drop(self, points: int, why: str) -> None:
        with self._lock:
            self.dropped_total += points
            self._dropped_unreported += points
            first = not self._warned_drop
            self._warned_drop = True
        if first and points:
            _warn(
                f"rankscope: dropping metric points because {why}; the job is unaffected "
                "and the count is reported when export recovers"
            )

    # -- export thread -----------------------------------------------------------------

    def _run(self) -> None:
        try:
            self.backends.init()
        except Exception as exc:
            self._on_error("backend init", exc)
        pending: list[StepBatch] = []  # prepared steps waiting for the next OTLP request
        last_export = 0.0
        stop = False
        while not stop:
            wait = self.export_interval if not pending else max(0.0, last_export + _MIN_EXPORT_GAP - time.monotonic())
            try:
                items = [self._queue.get(timeout=wait)]
            except queue.Empty:
                items = []
            while items and len(items) < _MAX_ITEMS_PER_ROUND:  # take what is already waiting
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            syncs: list[threading.Event] = []
            for kind, *rest in items:
                if kind == "batch":
                    with self._lock:
                        self._queued_steps -= 1
                    self._guarded(self._prepare, rest[0])
                    pending.append(rest[0])
                elif kind == "stream":
                    if self.stream_to_sink:
                        self._streams.append((rest[0], rest[1]))
                    else:
                        self._guarded(self.backends.log_stream, *rest)
                elif kind == "sync":
                    syncs.append(rest[0])
                elif kind == "stop":
                    stop = True
            due = time.monotonic() - last_export >= _MIN_EXPORT_GAP
            if not items and not pending and self._periodic():
                self._guarded(self._periodic_export)
            elif not pending and len(self.spans) and (due or syncs or stop):  # e.g. GPU spans after their step
                self._guarded(self._export_spans)
            elif (pending or self._streams) and (syncs or stop or due):
                self._guarded(self._export, pending, stop)
                pending, last_export = [], time.monotonic()
            elif stop:
                self._guarded(self._export, [], True)
            for done in syncs:
                done.set()
        self._guarded(self.backends.finish)

    def _guarded(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:
            self._on_error(getattr(fn, "__name__", "export"), exc)

    def _periodic_export(self) -> None:
        self._export_spans()
        batch = self.collector.take(None)
        if batch is not None:
            self._prepare(batch)
            self._export([batch])
        elif self._streams:
            self._export([])

    def _prepare(self, batch: StepBatch) -> None:
        """Read device values and GPU-timed durations, then give the step to the local backends."""
        if batch.deferred:
            self.collector.resolve_deferred(batch)
        if batch.device is not None:
            self.collector.stream_device_values(batch, batch.device.values())
            batch.device = None
        self.backends.log_batch(batch)

    def _export(self, batches: list[StepBatch], goodbye: bool = False) -> None:
        if self.otlp is None:
            return
        self._export_spans()  # before the flush markers: the sink sees a step's spans when it closes it
        if self._streams:
            streams, self._streams = self._streams, []
            if not self._send_logs(streams):
                self._drop(len(streams), "the OTLP endpoint did not accept streamed values")
        sdk_data = self._reader.pull()
        request = encode_metrics(sdk_data) if sdk_data is not None else ExportMetricsServiceRequest()
        if batches:
            scope = request.resource_metrics.add(resource=self._resource_pb).scope_metrics.add(scope=self._scope)
        points = 0
        for batch in batches:
            t0, t1 = batch.start_time_unix_nano, batch.time_unix_nano
            for i, (key, acc) in enumerate(batch.accs.items()):
                metric = encode(key, acc, batch.step, t0, t1, self._point_attributes)
                if metric is not None:
                    scope.metrics.append(metric)
                if i % 32 == 31:
                    time.sleep(0)  # hand the GIL back to the training thread between chunks
            points += len(batch.accs)
            if batch.step is not None:  # "this process closed step N" (value: number of keys)
                marker = scope.metrics.add(name=attr.FLUSH_MARKER, unit="{key}")
                marker.sum.aggregation_temporality = pb.AGGREGATION_TEMPORALITY_DELTA
                marker.sum.is_monotonic = True
                point = marker.sum.data_points.add(
                    start_time_unix_nano=t0,
                    time_unix_nano=t1,
                    as_int=len(batch.accs),
                    attributes=self._point_attributes.get("flush", batch.step)[1:],
                )
                if batch.expected:
                    point.attributes.append(key_value(attr.EXPECTED_PROCESSES, batch.expected))
                if batch.driven:
                    point.attributes.append(key_value(attr.DRIVEN, True))
        if goodbye:  # "this process is done: stop waiting for its steps"
            if not batches:
                scope = request.resource_metrics.add(resource=self._resource_pb).scope_metrics.add(scope=self._scope)
            bye = scope.metrics.add(name=attr.GOODBYE)
            bye.sum.aggregation_temporality = pb.AGGREGATION_TEMPORALITY_DELTA
            bye.sum.data_points.add(time_unix_nano=time.time_ns(), as_int=1)
        if not request.resource_metrics:
            return
        if self._send(request):
            self._report_drops(final=False)
        else:
            self._drop(points, "the OTLP endpoint did not accept an export")

    def _export_spans(self) -> None:
        """Send the span buffer; a failed request's spans are counted, reported once export recovers."""
        while len(self.spans):
            records = self.spans.drain(_MAX_SPANS_PER_REQUEST)
            request = encode_spans(records, self._resource_pb, self._scope)
            try:
                ok = self.otlp is not None and self.otlp.send_spans(request)
            except Exception as exc:
                self._warn_unreachable(exc)
                ok = False
            if not ok:
                self.spans.dropped += len(records)
                if not self._spans_warned:
                    self._spans_warned = True
                    _warn("rankscope: dropping spans: the OTLP endpoint did not accept them; the job is unaffected")
                return
        if self.spans.dropped > self._spans_dropped_reported:  # a send went through: report what was lost
            n = self.spans.dropped - self._spans_dropped_reported
            self._spans_dropped_reported = self.spans.dropped
            self._spans_warned = False
            _warn(f"rankscope: {n} spans were dropped ({self.spans.dropped} in total)")

    def _send(self, request: Any) -> bool:
        try:
            return bool(self.otlp is not None and self.otlp.send(request))
        except Exception as exc:  # e.g. the embedded sink could not start: count, warn once
            self._warn_unreachable(exc)
            return False

    def _warn_unreachable(self, exc: Exception) -> None:
        if not getattr(self, "_warned_unreachable", False):
            self._warned_unreachable = True
            _warn(f"rankscope: no sink could be reached ({exc}); metrics are counted as dropped")

    def _send_logs(self, streams: list[tuple[Metric, int | None]]) -> bool:
        request = ExportLogsServiceRequest()
        records = request.resource_logs.add(resource=self._resource_pb).scope_logs.add(scope=self._scope)
        for metric, step in streams:
            record = records.log_records.add(
                time_unix_nano=int((metric.timestamp or time.time()) * 1e9),
                severity_number=9,  # INFO
                severity_text="INFO",
            )
            record.body.string_value = f"{metric.key}: {metric.value}"
            record.attributes.extend(
                [key_value(attr.STREAM_KEY, metric.key), key_value(attr.STREAM_VALUE, float(metric.value))]
            )
            if step is not None:
                record.attributes.append(key_value(attr.STEP, step))
        try:
            return bool(self.otlp is not None and self.otlp.send_logs(request))
        except Exception as exc:
            self._warn_unreachable(exc)
            return False

    def _report_drops(self, final: bool) -> None:
        with self._lock:
            n, self._dropped_unreported = self._dropped_unreported, 0
            self._warned_drop = False
        if n:
            self._dropped_counter.add(n)
            state = "at shutdown" if final else "before export recovered"
            _warn(f"rankscope: {n} metric points were dropped {state} ({self.dropped_total} in total)")
