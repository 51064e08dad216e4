"""How each kind of data reaches a run's views (``Writes``): a finished step (its anomaly records,
its global values and samples to the global views, each process's values to the per-process
views, then the run log's ``written_view``), a streamed value, an anomaly record, a streamed sample
row, an ordinary log record, a report page; every call guarded (``calls.Calls``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ...backends.base import LoggingMode
from ..checked import Process
from .calls import BackendView, Calls
from .messages import Data, Detected, Finalized, Log, Report, Row, Stream
from .step import StepView, entry

log = logging.getLogger("rankscope.sink")

Written = Callable[[int, int, int, int], None]
"""(step, seq, last finalized step, attempt): a step's view is in every view (the run log's
``written_view``; a late update passes -1 and 0, moving neither the frontier nor the attempt)."""


def _identity(process: Process) -> dict[str, Any]:
    return {
        "process_name": process.label,
        "process": process,
        "rank": process.rank,
        "world_size": process.world_size,
        "role": process.role,
        "replica": process.replica,
    }


class Writes:
    """One run's data written to its views (``views``), on the thread that handles its inbox."""

    def __init__(
        self,
        experiment: str,
        views: list[BackendView],
        calls: Calls,
        *,
        on_written: Written | None = None,
        run: str = "",
    ) -> None:
        self.experiment = experiment
        self.run = run
        self.views = views
        self._call = calls.call
        self._answer = calls.answer
        self._on_written = on_written

    def write(self, message: Data) -> None:
        match message:
            case Finalized(view):
                self._write_step(view)
            case Stream(process, metric, step):
                for target in self._live(LoggingMode.PER_RANK_NO_REDUCE):
                    self._call(target, target.backend.log_stream, metric, step, **_identity(process))
            case Detected(record, step):
                for target in self._live(LoggingMode.GLOBAL_REDUCE):
                    self._call(target, target.backend.log_anomaly, record, step)
            case Row(process, row):
                self._write_row(process, row)
            case Log(process, record, step):
                self._write_log(process, record, step)
            case Report():
                self._write_report(message)

    def _write_report(self, message: Report) -> None:
        for view in self.views:
            if not view.disabled:
                found = self._answer(view, view.backend.report, message.status)
                if found:
                    message.paths.append(found)
        for view in self.views:  # the pages written, to the views that keep a run's files (MLflow's artifacts)
            if not view.disabled:
                self._call(view, view.backend.keep_files, list(message.paths), message.status)
        message.done.set()

    def _write_row(self, process: Process, row: Any) -> None:
        rows = [entry(row.table, row.step, "stream", (process, row))]
        for view in self._live(LoggingMode.PER_RANK_NO_REDUCE):
            self._call(view, view.backend.log_samples, row.table, rows, row.step, **_identity(process))

    def _write_log(self, process: Process, record: Any, step: int) -> None:
        row = {
            "time": record.time_unix_nano / 1e9,
            "severity": record.severity,
            "body": record.body,
            "attributes": record.attributes,
            "trace_id": record.trace_id or None,
        }
        for view in self.views:
            if not view.disabled:
                self._call(view, view.backend.log_record, row, step, **_identity(process))

    def _live(self, mode: LoggingMode) -> list[BackendView]:
        return [v for v in self.views if not v.disabled and v.backend.logging_mode is mode]

    def _write_step(self, view: StepView) -> None:
        if view.rewound and not view.late:
            run = f" run {self.run[:64]}" if self.run else ""
            why = " (the time buckets before the first flush: their values are this step's)" if view.carried else ""
            log.warning(
                "rankscope sink: experiment %s%s rewound to step %d%s", self.experiment[:64], run, view.step, why
            )
            for target in self.views:
                if not target.disabled:
                    self._call(target, target.backend.rewind, view.step)
        named = view.missing[: len(view.missing) - view.away]  # the others were named at an earlier step
        if named and not view.late:
            log.warning(
                "rankscope sink: experiment %s step %d finalized without %s (%d missing)",
                view.experiment[:64],
                view.step,
                ", ".join(repr(m) for m in named[:16]) + (", ..." if len(named) > 16 else ""),
                len(view.missing),
            )
        for target in self._live(LoggingMode.GLOBAL_REDUCE):
            for record in view.anomalies:  # before the step's values: W&B logs them in the step's row
                self._call(target, target.backend.log_anomaly, record, view.step)
            if (
                self._call(
                    target,
                    target.backend.log_batch,
                    view.global_metrics,
                    view.step,
                    per_process=view.per_process,
                    late=view.late,
                    labels=view.labels,
                    missing=view.missing,
                    phase_times=view.phase_times,
                    step_seconds=view.duration,
                    finalized_at=view.finalized_at,
                    spans=lambda: [span.row() for span in view.spans],
                )
                and not view.late
            ):
                target.written_step = max(target.written_step, view.step)
            for table, rows in view.samples.items():
                self._call(target, target.backend.log_samples, table, rows, view.step, late=view.late)
        for target in self._live(LoggingMode.PER_RANK_REDUCE):
            ok = True
            for process, metrics in view.per_process.items():
                ok = (
                    self._call(
                        target, target.backend.log_batch, metrics, view.step, late=view.late, **_identity(process)
                    )
                    and ok
                )
            if ok and not view.late:
                target.written_step = max(target.written_step, view.step)
        if self._on_written is not None and view.seq:  # a late update moves neither the frontier nor the attempt
            late = view.late
            for bucket, seq in view.carried.items():  # their records are in this step now (``book.buckets``)
                self._on_written(bucket, seq, -1, 0)
            self._on_written(view.step, view.seq, -1 if late else view.step, 0 if late else view.attempt)
