"""A plain OpenTelemetry SDK program, nothing of rankscope in it: metrics, spans and logs over OTLP/gRPC.

argv: endpoint, experiment id, instance name, temporality (delta|cumulative), gauge value,
up-down total, seconds to keep exporting. Records the same 100 histogram values
(i + 0.5, i < 100) at once, adds 1 to a counter every 10 ms, a final up-down total, and an
observable gauge; exports every 200 ms until the time is up, then shuts down.
"""

from __future__ import annotations

import logging
import sys
import time

from opentelemetry import metrics, trace
from opentelemetry._logs import set_logger_provider
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider, UpDownCounter
from opentelemetry.sdk.metrics.export import AggregationTemporality, PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

endpoint, experiment, instance, temporality, gauge, updown, seconds = sys.argv[1:8]
resource = Resource.create(
    {"rankscope.experiment.id": experiment, "service.name": "plain-otel", "service.instance.id": instance}
)
which = AggregationTemporality.DELTA if temporality == "delta" else AggregationTemporality.CUMULATIVE
reader = PeriodicExportingMetricReader(
    OTLPMetricExporter(
        endpoint=endpoint,
        insecure=True,
        # As the OTel spec's delta preference has it: up-down counters stay cumulative (a level).
        preferred_temporality={Counter: which, Histogram: which, UpDownCounter: AggregationTemporality.CUMULATIVE},
    ),
    export_interval_millis=200,
)
bounds = [10.0 * i for i in range(1, 11)]  # 10, 20, ..., 100
views = [View(instrument_name="latency", aggregation=ExplicitBucketHistogramAggregation(boundaries=bounds))]
meter_provider = MeterProvider(resource=resource, metric_readers=[reader], views=views)
metrics.set_meter_provider(meter_provider)
tracer_provider = TracerProvider(resource=resource)
tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True)))
trace.set_tracer_provider(tracer_provider)
logger_provider = LoggerProvider(resource=resource)
logger_provider.add_log_record_processor(BatchLogRecordProcessor(OTLPLogExporter(endpoint=endpoint, insecure=True)))
set_logger_provider(logger_provider)
log = logging.getLogger("plain")
log.addHandler(LoggingHandler(logger_provider=logger_provider))
log.setLevel(logging.INFO)

meter = metrics.get_meter("plain")
requests = meter.create_counter("requests")
latency = meter.create_histogram("latency", unit="ms")
queue = meter.create_up_down_counter("queue_depth")


def temperature(options: CallbackOptions) -> list[Observation]:
    return [Observation(float(gauge))]


meter.create_observable_gauge("temperature", callbacks=[temperature])
tracer = trace.get_tracer("plain")

for i in range(100):
    latency.record(i + 0.5)
queue.add(int(updown) + 3)
queue.add(-3)
with tracer.start_as_current_span(f"work-{instance}"):
    log.warning("plain warning from %s", instance)
    time.sleep(0.05)
end = time.monotonic() + float(seconds)
added = 0
while time.monotonic() < end:
    requests.add(1, {"route": "/x"})
    added += 1
    time.sleep(0.01)
meter_provider.shutdown()
tracer_provider.shutdown()
logger_provider.shutdown()
print(added, flush=True)
