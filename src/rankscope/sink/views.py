"""One experiment's backends, run on their own thread so a slow or failing view never stalls
ingest or another experiment.

The sink calls the same ``LoggerBackend`` interface the SDK does; extra keyword arguments
say whose values they are: ``per_process`` (global views: every process's values),
``process_name``/``process`` (per-process views and streams), ``late`` (a late update),
``labels`` (global views: the process a value names, e.g. who holds ``{key}/argmax_rank``),
and for global views ``missing`` (labels of processes the step went without), ``phase_times``
(phase → process → seconds) and ``spans`` (a callable giving the step's spans in their JSONL
form: a view that wants them pays for them).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import queue
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ..backends.base import LoggerBackend, LoggingMode, Metric, get_backend_class
from .experiment import Process, StepView
from .tables import entry

log = logging.getLogger("rankscope.sink")


def _identity(process: Process) -> dict[str, Any]:
    return {
        "process_name": process.label,
        "process": process,
        "rank": process.rank,
        "world_size": process.world_size,
        "role": process.role,
        "replica": process.replica,
    }


class _View:
    """One backend and what the status route says about it."""

    __slots__ = ("backend", "disabled", "failures", "last_error", "name", "written_step")

    def __init__(self, name: str, backend: LoggerBackend) -> None:
        self.name, self.backend = name, backend
        self.written_step = -1
        self.failures = 0
        self.last_error: str | None = None
        self.disabled = False

    def status(self) -> dict[str, Any]:
        return {
            "location": self.backend.location,
            "last_written_step": self.written_step,
            "failures": self.failures,
            "last_error": self.last_error,
            "disabled": self.disabled,
        }


class ViewWriter:
    """Owns one run's backends and the thread that calls them.

    A backend whose ``init`` fails is disabled with one error naming it (W&B without an API
    key, say); one whose writes fail keeps being called, and the status route shows its last
    *successfully* written step and its last error. After each step, ``on_written(view)``
    lets the write-ahead log drop what is now in every view."""

    def __init__(
        self,
        experiment: str,
        config: Mapping[str, Mapping[str, Any]],
        on_error: Callable[[str, BaseException], None],
        max_queued: int = 4096,
        on_written: Callable[[StepView], None] | None = None,
        start_thread: Callable[[str, Callable[[], None]], threading.Thread] | None = None,
        run: str = "",
    ) -> None:
        self.experiment = experiment
        self.run = run
        self._on_error = on_error
        self._on_written = on_written
        self.views: list[_View] = []
        for name, options in config.items():
            try:
                backend = get_backend_class(str(options.get("backend", name)))(dict(options))
            except Exception as exc:
                on_error(f"view {name!r} of {experiment[:64]!r}: bad configuration", exc)
                continue
            self.views.append(_View(name, backend))
        self._queue: queue.Queue[Any] = queue.Queue(max_queued)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.dropped = 0
        self.written_step = -1
        self.closed = threading.Event()
        self._handlers: dict[str, Callable[[Any], None]] = {
            "sync": self._on_sync,
            "report": self._on_report,
            "step": self._on_step,
            "stream": self._on_stream,
            "anomaly": self._on_anomaly,
            "row": self._on_row,
            "log": self._on_log,
        }
        """The writer thread's handler of each kind of queued item (its first element); "stop" ends it."""
        name = f"rankscope-views-{experiment[:32]}"
        if start_thread is None:
            self._thread = threading.Thread(target=self._run, name=name, daemon=True)
            self._thread.start()
        else:
            self._thread = start_thread(name, self._run)

    @property
    def backends(self) -> list[LoggerBackend]:
        return [v.backend for v in self.views]

    def status(self) -> dict[str, Any]:
        return {view.name: view.status() for view in self.views}

    def step(self, view: StepView) -> None:
        self._put(("step", view))

    def stream(self, process: Process, metric: Metric, step: int | None) -> None:
        self._put(("stream", process, metric, step))

    def anomaly(self, record: dict[str, Any], step: int | None) -> None:
        """An anomaly record outside a step's view (a capture's files, say): global views."""
        self._put(("anomaly", record, step))

    def row(self, process: Process, row: Any) -> None:
        """A streamed sample row (``otlp.samples.SampleRow``, every row a process recorded)."""
        self._put(("row", process, row))

    def log(self, process: Process, record: Any, step: int) -> None:
        """An ordinary OTel log record (``validate.LogRecord``) of ``process``, in ``step``."""
        self._put(("log", process, record, step))

    def report(self, status: dict[str, Any] | None, timeout: float | None) -> list[str]:
        """Have the views that write a page (the report view) write it after what is queued; with
        a ``timeout``, wait and return where they wrote (else return at once)."""
        done: tuple[threading.Event, list[str]] = (threading.Event(), [])
        self._put(("report", status, done))
        if timeout is None or not done[0].wait(timeout):
            return []
        return done[1]

    def close(self, timeout: float) -> None:
        self.request_close(timeout)
        self.join(timeout)

    def request_close(self, timeout: float) -> None:
        """Ask the writer to finish its backends after what is queued (W&B's finish can take seconds)."""
        with contextlib.suppress(queue.Full):
            self._queue.put(("stop",), timeout=timeout)

    def join(self, timeout: float) -> bool:
        self._thread.join(max(0.0, timeout))
        return not self._thread.is_alive()

    def wait_idle(self, timeout: float) -> bool:
        done = threading.Event()
        self._put(("sync", done))
        return done.wait(timeout)

    def _put(self, item: Any) -> None:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1:
                log.warning("rankscope sink: views of %s are too slow; dropping updates", self.experiment[:64])

    def _call(self, view: _View, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
        try:
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                if self._loop is None:
                    self._loop = asyncio.new_event_loop()
                self._loop.run_until_complete(result)
            return True
        except Exception as exc:
            view.failures += 1
            view.last_error = f"{type(exc).__name__}: {exc}"[:500]
            if view.failures == 1 or view.failures % 1000 == 0:  # logged once, then rarely; always counted
                self._on_error(f"view {view.name!r} of {self.experiment[:64]!r} ({fn.__name__})", exc)
            return False

    def _answer(self, view: _View, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` called as ``_call`` calls it; its answer, None if it failed."""
        answer: list[Any] = []

        def call() -> None:
            answer.append(fn(*args))

        call.__name__ = fn.__name__
        self._call(view, call)
        return answer[0] if answer else None

    def _run(self) -> None:
        try:
            self._init_views()
            while True:
                item = self._queue.get()
                if item[0] == "stop":
                    break
                handler = self._handlers.get(item[0])
                if handler is not None:
                    handler(item)
            self._finish_views()
        finally:
            if self._loop is not None:
                self._loop.close()
            self.closed.set()

    def _init_views(self) -> None:
        """Init every view, disabling those whose init fails or that turn themselves off, and log which are on."""
        for view in self.views:
            if not self._call(view, view.backend.init, "global", experiment=self.experiment, run=self.run, role="sink"):
                view.disabled = True
            elif view.backend.off_reason:  # the backend turned itself off (and logged why)
                view.disabled = True
                view.last_error = view.backend.off_reason[:500]
                continue
            if view.disabled:
                log.error(
                    "rankscope sink: view %r of %s is off: its init failed (%s)",
                    view.name,
                    self.experiment[:64],
                    view.last_error,
                )
        where = ", ".join(f"{v.name} -> {v.backend.location or '?'}" for v in self.views if not v.disabled)
        run = f" run {self.run[:64]}" if self.run else ""
        log.info("rankscope sink: new experiment %s%s: %s", self.experiment[:256], run, where or "no view is on")

    def _finish_views(self) -> None:
        for view in self.views:
            if not view.disabled:
                self._call(view, view.backend.finish)

    def _on_sync(self, item: Any) -> None:
        item[1].set()

    def _on_report(self, item: Any) -> None:
        _, status, (done, paths) = item
        for view in self.views:
            if not view.disabled:
                found = self._answer(view, view.backend.report, status)
                if found:
                    paths.append(found)
        done.set()

    def _on_step(self, item: Any) -> None:
        self._write_step(item[1])

    def _on_stream(self, item: Any) -> None:
        _, process, metric, step = item
        for view in self._live(LoggingMode.PER_RANK_NO_REDUCE):
            self._call(view, view.backend.log_stream, metric, step, **_identity(process))

    def _on_anomaly(self, item: Any) -> None:
        for view in self._live(LoggingMode.GLOBAL_REDUCE):
            self._call(view, view.backend.log_anomaly, item[1], item[2])

    def _on_row(self, item: Any) -> None:
        _, process, row = item
        rows = [entry(row.table, row.step, "stream", (process, row))]
        for view in self._live(LoggingMode.PER_RANK_NO_REDUCE):
            self._call(view, view.backend.log_samples, row.table, rows, row.step, **_identity(process))

    def _on_log(self, item: Any) -> None:
        _, process, record, step = item
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

    def _live(self, mode: LoggingMode) -> list[_View]:
        return [v for v in self.views if not v.disabled and v.backend.logging_mode is mode]

    def _write_step(self, view: StepView) -> None:
        if view.rewound and not view.late:
            run = f" run {self.run[:64]}" if self.run else ""
            log.warning("rankscope sink: experiment %s%s rewound to step %d", self.experiment[:64], run, view.step)
            for target in self.views:
                if not target.disabled:
                    self._call(target, target.backend.rewind, view.step)
        if view.missing and not view.late:
            log.warning(
                "rankscope sink: experiment %s step %d finalized without %s (%d missing)",
                view.experiment[:64],
                view.step,
                ", ".join(repr(m) for m in view.missing[:16]) + (", ..." if len(view.missing) > 16 else ""),
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
        if not view.late:
            self.written_step = max(self.written_step, view.step)
        if self._on_written is not None:
            self._on_written(view)
