"""rankscope: one call from anywhere, one view per experiment, on OpenTelemetry.

This module only re-exports (``api``); the packages are named by pipeline stage (``docs/development.md``, Layout).
Importing it changes nothing global: ``init`` (or the first call) configures the process.
"""

from . import rl, throughput
from ._version import __version__
from .api import (
    Tracer,
    capture,
    current_step,
    dropped_points,
    flush,
    force_flush,
    get_resource,
    init,
    inject_env,
    record_event,
    record_metric,
    record_sample,
    set_step,
    shutdown,
    trace,
    write_report,
)
from .backends.base import LoggerBackend, LoggingMode, Metric, register_backend
from .metrics.reduce import DISTRIBUTION_RELATIVE_ERROR, MetricAccumulator, Reduce
from .tracing.gpu_timing import CudaTimingProcessor

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
    "capture",
    "current_step",
    "dropped_points",
    "flush",
    "force_flush",
    "get_resource",
    "init",
    "inject_env",
    "record_event",
    "record_metric",
    "record_sample",
    "register_backend",
    "rl",
    "set_step",
    "shutdown",
    "throughput",
    "trace",
    "write_report",
]
