"""rankscope: one call from anywhere, one view per experiment, on OpenTelemetry.

This module only re-exports; the implementation lives in ``rankscope._internal``.
Importing it changes nothing global: ``init`` (or the first call) configures the process.
"""

from . import rl, throughput
from ._version import __version__
from .backends.base import LoggerBackend, LoggingMode, Metric, register_backend
from .lifecycle import (
    current_step,
    dropped_points,
    flush,
    force_flush,
    get_resource,
    init,
    record_metric,
    shutdown,
)
from .metrics.reduce import (
    DISTRIBUTION_RELATIVE_ERROR,
    MetricAccumulator,
    Reduce,
)
from .tracing.gpu_timing import CudaTimingProcessor
from .tracing.tracer import Tracer, inject_env, record_event, set_step, trace

__all__ = [
    "DISTRIBUTION_RELATIVE_ERROR",
    "CudaTimingProcessor",
    "LoggerBackend",
    "LoggingMode",
    "Metric",
    "MetricAccumulator",
    "Reduce",
    "Tracer",
    "__version__",
    "current_step",
    "dropped_points",
    "flush",
    "force_flush",
    "get_resource",
    "init",
    "inject_env",
    "record_event",
    "record_metric",
    "register_backend",
    "rl",
    "set_step",
    "shutdown",
    "throughput",
    "trace",
]
