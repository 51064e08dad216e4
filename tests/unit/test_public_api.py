"""The import surface of ``rankscope`` is locked."""

from __future__ import annotations

import rankscope as rs

PUBLIC = [
    "CudaTimingProcessor",
    "DISTRIBUTION_RELATIVE_ERROR",
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


def test_public_surface_is_locked() -> None:
    assert sorted(rs.__all__) == sorted(PUBLIC)
    for name in PUBLIC:
        assert hasattr(rs, name), name
