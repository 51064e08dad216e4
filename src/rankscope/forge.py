"""``rankscope.forge``: the Forge drop-in for ``forge.observability`` (``rankscope.integrations.forge``)."""

from .integrations.forge import (
    LoggerBackend,
    LoggingMode,
    Metric,
    MetricAccumulator,
    MetricLogger,
    Reduce,
    Tracer,
    get_or_create_metric_logger,
    record_metric,
    trace,
)

__all__ = [
    "LoggerBackend",
    "LoggingMode",
    "Metric",
    "MetricAccumulator",
    "MetricLogger",
    "Reduce",
    "Tracer",
    "get_or_create_metric_logger",
    "record_metric",
    "trace",
]
