"""A process's own views: its local backends, called on the export thread only.

``per_rank_reduce`` backends get each step's reduced values, ``per_rank_no_reduce`` ones every
raw value. A ``global_reduce`` view needs every process and belongs to a sink. Forge-style
``async`` backends run on one event loop of this thread.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..backends.base import LoggerBackend, LoggingMode, Metric, sample_entry
from ..backends.console import write_line
from ..core.paths import shown_path
from ..metrics.recorder import StepBatch
from ..metrics.reduce import reduced_items
from ..metrics.samples import Kept, Provenance, Row

_SAID_PAGES: set[str] = set()
"""The report pages this process said (``report: PATH``): once each, however often it re-inits."""


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
            self._loop.run_until_complete(result)

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
        # The step's wall time, flush to flush (a console shows it when nothing was traced).
        seconds = (batch.time_unix_nano - batch.start_time_unix_nano) / 1e9 if batch.step is not None else None
        for backend in self.reducing:
            self.call(backend.log_batch, metrics, batch.step, step_seconds=seconds)

    def log_stream(self, metric: Metric, step: int | None) -> None:
        for backend in self.streaming:
            self.call(backend.log_stream, metric, step)

    def log_samples(self, batch: StepBatch) -> None:
        """Per-rank views get this process's own selection of each table."""
        if not self.reducing:
            return
        for table in batch.samples or ():
            rows = [self._entry(table.table, kept, kept.side, batch.step) for kept in table.distinct()]
            if rows:
                for backend in self.reducing:
                    self.call(backend.log_samples, table.table, rows, batch.step)

    def log_row(self, table: str, row: Row, origin: Provenance, step: int | None) -> None:
        """``per_rank_no_reduce`` views get every row as it is recorded."""
        entry = [self._entry(table, Kept(0.0, 0, "stream", row, origin), "stream", step)]
        for backend in self.streaming:
            self.call(backend.log_samples, table, entry, step)

    def _entry(self, table: str, kept: Kept, side: str, step: int | None) -> dict[str, Any]:
        origin: Provenance = kept.origin
        return sample_entry(
            table,
            step,
            side,
            kept.row,
            time_unix_nano=origin.time_unix_nano,
            trace_id=f"{origin.trace_id:032x}" if origin.trace_id else None,
            span_id=f"{origin.span_id:016x}" if origin.span_id else None,
            policy_version=origin.policy_version,
            process=self._process_name,
        )

    def finish(self) -> None:
        """Finish every view; a page one wrote (the report view) is said on stdout, ``report: PATH``,
        as a job's sink says its run's."""
        for backend in self.backends:
            self.call(backend.finish)
            page = backend.location if type(backend).report is not LoggerBackend.report else None
            if page and page not in _SAID_PAGES and Path(page).is_file():  # a re-init finishes them too
                _SAID_PAGES.add(page)
                write_line(sys.stdout, f"report: {shown_path(page)}")
        if self._loop is not None:
            self._loop.close()
