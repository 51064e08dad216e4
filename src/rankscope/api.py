"""The public calls, thin: each forwards to the stage that does the work.

``record_metric`` is the metrics stage's hot path and ``record_sample`` its sample tables;
``init``/``flush``/``shutdown`` assemble, step and take down the runtime (``lifecycle``);
``trace``/``Tracer``/``set_step`` are the tracing stage's. ``rankscope/__init__`` re-exports exactly these.
"""

from __future__ import annotations

from .lifecycle import (
    capture,
    current_step,
    dropped_points,
    flush,
    force_flush,
    get_resource,
    init,
    shutdown,
    write_report,
)
from .metrics.recording import record_metric, record_sample
from .tracing.tracer import Tracer, inject_env, record_event, set_step, trace

__all__ = [
    "Tracer",
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
    "set_step",
    "shutdown",
    "trace",
    "write_report",
]
