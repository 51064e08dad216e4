"""Drop-in for ``forge.observability``: change the imports, keep the code.

``get_or_create_metric_logger`` returns this process's logger; its ``init_backends``,
``flush`` and ``shutdown`` work as Monarch endpoints do (``await m.flush.call_one(global_step=0)``)
and as plain coroutines (``await m.flush(global_step=0)``). Under the hood they are
``rankscope.init(backends=...)``, ``rankscope.flush(step)`` and ``rankscope.shutdown()``:
global views are reduced exactly in the sink, and a Monarch controller's flush closes the
step in every actor process it created. A console view prints Forge's format (``format: full``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from ..api import flush, init, shutdown
from ..backends.base import LoggerBackend, LoggingMode, Metric
from ..metrics.recording import record_metric
from ..metrics.reduce import MetricAccumulator, Reduce
from ..tracing.tracer import Tracer, trace

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


class _Endpoint:
    """A method callable as ``await m.x(...)``, ``await m.x.call_one(...)`` or ``await m.x.call(...)``."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self._fn = fn

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(*args, **kwargs)

    call_one = __call__
    call = __call__


class MetricLogger:
    """This process's logger: the controller of a Forge-style job."""

    def __init__(self, process_name: str | None) -> None:
        self.process_name = process_name
        self.init_backends = _Endpoint(self._init_backends)
        self.flush = _Endpoint(self._flush)
        self.shutdown = _Endpoint(self._shutdown)

    def _init_backends(self, config: Mapping[str, Mapping[str, Any]], *args: Any, **kwargs: Any) -> None:
        role = None if os.environ.get("RANKSCOPE_ROLE") else (self.process_name or "controller").lower()
        init(backends={name: _forge_format(name, options) for name, options in config.items()}, role=role)

    def _flush(self, global_step: int = 0, *args: Any, **kwargs: Any) -> None:
        flush(global_step)

    def _shutdown(self, *args: Any, **kwargs: Any) -> None:
        shutdown()


def _forge_format(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """A console view prints Forge's blocks (every key, as recorded) unless the config says otherwise."""
    if options.get("backend", name) == "console" and "format" not in options:
        return {**options, "format": "full"}
    return dict(options)


_logger: MetricLogger | None = None


async def get_or_create_metric_logger(process_name: str | None = None, *args: Any, **kwargs: Any) -> MetricLogger:
    """The process's one logger (created on first call)."""
    global _logger
    if _logger is None:
        _logger = MetricLogger(process_name)
    return _logger
