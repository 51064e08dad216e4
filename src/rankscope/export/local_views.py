"""A process's own views: its local backends, called on the export thread only.

``per_rank_reduce`` backends get each step's reduced values, ``per_rank_no_reduce`` ones every
raw value. A ``global_reduce`` view needs every process and belongs to a sink. Forge-style
``async`` backends run on one event loop of this thread.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any

from ..backends.base import LoggerBackend, LoggingMode, Metric
from ..metrics.recorder import StepBatch
from ..metrics.reduce import reduced_items


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
        """A backend whose init fails is off from then on, with one error naming it (not one per step)."""
        for backend in list(self.backends):
            try:
                self.call(backend.init, self._process_name, **self._init_kwargs)
            except Exception as exc:
                logging.getLogger("rankscope").error(
                    "rankscope: the %s backend is off: its init failed (%s: %s)",
                    type(backend).__name__,
                    type(exc).__name__,
                    exc,
                )
                self.backends.remove(backend)
                for group in (self.reducing, self.streaming):
                    if backend in group:
                        group.remove(backend)

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
