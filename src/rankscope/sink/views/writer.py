"""Every run's backends, written on a bounded pool of threads, so a slow or failing view never
stalls ingest, a view stuck in a slow call holds one thread (the pool grows past stuck ones, up
to a bound), and a sink with 300 open runs does not hold 300 threads.

The sink calls the same ``LoggerBackend`` interface the SDK does; extra keyword arguments
say whose values they are: ``per_process`` (global views: every process's values),
``process_name``/``process`` (per-process views and streams), ``late`` (a late update),
``labels`` (global views: the process a value names, e.g. who holds ``{key}/argmax_rank``),
and for global views ``missing`` (labels of processes the step went without), ``phase_times``
(phase → process → seconds), ``step_seconds`` (the step's time, first close to first close)
and ``spans`` (a callable giving the step's spans in their JSONL form: a view that wants them
pays for them).

Each run's ``ViewWriter`` holds a bounded inbox of typed messages; the ``ViewPool`` runs a writer
with mail on one of its threads, a few messages at a time, so one run's messages are handled in
order and by one thread at a time, and a busy run takes turns with the others. A writer's
backends open on the first message that needs them and give their files back on ``Release``
(the run went quiet) or when the sink's descriptor budget claims an idle writer (``release``,
on the caller's thread, as a turn would); the next message opens them again.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...backends.base import LoggerBackend, LoggingMode, Metric, get_backend_class
from ..checked import Process
from .step import StepView, entry

log = logging.getLogger("rankscope.sink")

TURN = 32
"""Messages a writer handles before it lets the next run with mail have a thread."""

Written = Callable[[int, int, int, int], None]
"""(step, seq, last finalized step, attempt): a step's view is in every view (the run log's
``written_view``; a late update passes -1 and 0, moving neither the frontier nor the attempt)."""

DROP_KINDS = ("step_views", "late_updates", "streamed_values", "sample_rows", "log_records", "anomaly_records")
"""What a run's views may drop, by kind of data (the status route's ``view_drops``)."""
DROP_LOG_INTERVAL = 10.0
"""Seconds between two log lines of one run's drops (every drop is counted: the status route)."""


@dataclass(slots=True)
class Step:
    view: StepView


@dataclass(slots=True)
class Stream:
    process: Process
    metric: Metric
    step: int | None


@dataclass(slots=True)
class Anomaly:
    record: dict[str, Any]
    step: int | None


@dataclass(slots=True)
class Row:
    process: Process
    row: Any
    """``otlp.samples.SampleRow``: a streamed sample row."""


@dataclass(slots=True)
class Log:
    process: Process
    record: Any
    """``checked.LogRecord``: an ordinary OTel log record."""
    step: int


@dataclass(slots=True)
class Report:
    status: dict[str, Any] | None
    done: threading.Event = field(default_factory=threading.Event)
    paths: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Sync:
    done: threading.Event = field(default_factory=threading.Event)


@dataclass(slots=True)
class Close:
    """Finish the backends after what is queued (W&B's finish can take seconds)."""


@dataclass(slots=True)
class Release:
    """Finish the backends after what is queued and give their files back; the next message that
    needs them opens them again (the sink's descriptor budget, ``durable.descriptors``)."""


Message = Step | Stream | Anomaly | Row | Log | Report | Sync | Close | Release


class ViewPool:
    """The threads that run every writer with mail (``ViewWriter``): ``workers`` of them, and one
    more, up to ``max_workers``, each time every thread has been held by one turn for ``stall``
    seconds (views stuck in a slow call hold their threads; the other runs' views go on)."""

    def __init__(
        self,
        workers: int,
        spawn: Callable[[str, Callable[[], None]], threading.Thread],
        *,
        max_workers: int | None = None,
        stall: float = 5.0,
    ) -> None:
        self._spawn = spawn
        self._ready: queue.SimpleQueue[ViewWriter | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._busy: dict[int, float] = {}
        """Thread ident -> when its current turn began (monotonic)."""
        self._threads: list[threading.Thread] = []
        self.max_workers = max(1, max_workers if max_workers is not None else 4 * workers)
        self.stall = stall
        with self._lock:
            for _ in range(max(1, workers)):
                self._add()

    @property
    def threads(self) -> int:
        return len(self._threads)

    def schedule(self, writer: ViewWriter) -> None:
        self._ready.put(writer)
        with self._lock:
            now = time.monotonic()
            stalled = len(self._busy) == len(self._threads) and all(now - t >= self.stall for t in self._busy.values())
            if stalled and len(self._threads) < self.max_workers:
                self._add()

    def stop(self, timeout: float) -> None:
        """End the threads after the writers scheduled so far."""
        deadline = time.monotonic() + timeout
        with self._lock:
            threads = list(self._threads)
        for _ in threads:
            self._ready.put(None)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _add(self) -> None:
        self._threads.append(self._spawn(f"views-{len(self._threads)}", self._work))

    def _work(self) -> None:
        me = threading.get_ident()
        while (writer := self._ready.get()) is not None:
            with self._lock:
                self._busy[me] = time.monotonic()
            try:
                writer.turn()
            finally:
                with self._lock:
                    del self._busy[me]


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
    """One run's backends and their inbox, handled on a ``ViewPool`` thread.

    A backend whose ``init`` fails is disabled with one error naming it (W&B without an API
    key, say); one whose writes fail keeps being called, and the status route shows its last
    *successfully* written step and its last error. After each step, ``on_written`` (the run
    log's ``durable.wal.ExperimentLog.written_view``) lets the write-ahead log drop what is now in
    every view. A full inbox drops the message, counted by kind of data (``drops``, ``DROP_KINDS``;
    also what arrives once the writer is closed), handed to ``on_drop`` (the sink's sum) and said
    at most once per ``DROP_LOG_INTERVAL``. With a write-ahead log, a dropped step's records stay
    in it (its segment is kept) and the sink's next start writes the step again (a late update of
    it when later steps were written); streamed values, streamed sample rows, log records and
    anomaly records are not in the log."""

    def __init__(
        self,
        experiment: str,
        config: Mapping[str, Mapping[str, Any]],
        on_error: Callable[[str, BaseException], None],
        pool: ViewPool,
        *,
        max_queued: int = 4096,
        on_written: Written | None = None,
        on_drop: Callable[[str], None] | None = None,
        on_open: Callable[[ViewWriter], object] | None = None,
        on_closed: Callable[[ViewWriter], object] | None = None,
        run: str = "",
    ) -> None:
        self.experiment = experiment
        self._config = config
        self._on_open = on_open
        """Called before the backends open (again) and after they finished: the sink's descriptor
        budget (``durable.descriptors``) counts their files."""
        self._on_closed = on_closed
        self.opens = 0
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
        self._pool = pool
        self._inbox: deque[Message] = deque()
        self._max_queued = max_queued
        self._lock = threading.Lock()
        self._scheduled = False
        self._opened = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.drops: dict[str, int] = dict.fromkeys(DROP_KINDS, 0)
        """Messages dropped (the inbox full, or the writer closed), by kind of data."""
        self._on_drop = on_drop
        self._drops_said = 0
        self._drop_said_at: float | None = None
        self.written_step = -1
        self.closed = threading.Event()

    @property
    def descriptors(self) -> int:
        """File descriptors the views hold while open (``LoggerBackend.descriptors``)."""
        return sum(v.backend.descriptors for v in self.views if not v.disabled)

    @property
    def drained(self) -> bool:
        """Nothing queued and no turn running: every step handed to it is written."""
        with self._lock:
            return not self._inbox and not self._scheduled

    def request_release(self) -> None:
        """Finish the backends after what is queued, giving their files back (``Release``)."""
        self._put(Release(), always=True)

    def release(self) -> bool:
        """Finish the backends now, on the calling thread, if no turn is running or due (the
        descriptor budget's LRU bound, ``durable.descriptors.Holder``): False, without waiting, when
        one is. What comes after opens them again."""
        with self._lock:
            if self._scheduled:
                return False
            if self.closed.is_set():
                return True
            self._scheduled = True  # claimed, as a turn claims it: no pool thread runs it meanwhile
        try:
            self._release()
        except BaseException as exc:  # a bug here must not reach the caller's request
            self._on_error(f"views of {self.experiment[:64]!r}", exc)
        finally:
            with self._lock:
                self._scheduled = again = bool(self._inbox)
            if again:
                self._pool.schedule(self)
        return True

    @property
    def dropped(self) -> int:
        """Messages dropped, of every kind."""
        return sum(self.drops.values())

    @property
    def backends(self) -> list[LoggerBackend]:
        return [v.backend for v in self.views]

    def status(self) -> dict[str, Any]:
        return {view.name: view.status() for view in self.views}

    def step(self, view: StepView) -> None:
        self._put(Step(view))

    def stream(self, process: Process, metric: Metric, step: int | None) -> None:
        self._put(Stream(process, metric, step))

    def anomaly(self, record: dict[str, Any], step: int | None) -> None:
        """An anomaly record outside a step's view (a capture's files, say): global views."""
        self._put(Anomaly(record, step))

    def row(self, process: Process, row: Any) -> None:
        """A streamed sample row (``otlp.samples.SampleRow``, every row a process recorded)."""
        self._put(Row(process, row))

    def log(self, process: Process, record: Any, step: int) -> None:
        """An ordinary OTel log record (``checked.LogRecord``) of ``process``, in ``step``."""
        self._put(Log(process, record, step))

    def report(self, status: dict[str, Any] | None, timeout: float | None) -> list[str]:
        """Have the views that write a page (the report view) write it after what is queued; with
        a ``timeout``, wait and return where they wrote (else return at once)."""
        message = Report(status)
        self._put(message, always=True)
        if timeout is None or not message.done.wait(timeout):
            return []
        return message.paths

    def close(self, timeout: float) -> None:
        self.request_close(timeout)
        self.join(timeout)

    def request_close(self, timeout: float = 0.0) -> None:
        """Finish the backends after what is queued (W&B's finish can take seconds)."""
        self._put(Close(), always=True)

    def join(self, timeout: float) -> bool:
        return self.closed.wait(max(0.0, timeout))

    def wait_idle(self, timeout: float) -> bool:
        message = Sync()
        self._put(message, always=True)
        return message.done.wait(timeout)

    def _put(self, message: Message, always: bool = False) -> None:
        """Queue ``message``; a full inbox drops it (``always``: control messages, never dropped)."""
        with self._lock:
            if self.closed.is_set() or (len(self._inbox) >= self._max_queued and not always):
                if isinstance(message, (Report, Sync)):
                    message.done.set()
                said = self._drop(message)
                schedule = False
            else:
                said = None
                self._inbox.append(message)
                schedule = not self._scheduled
                self._scheduled = True
        if said is not None:
            log.warning("rankscope sink: %s", said)
        if schedule:
            self._pool.schedule(self)

    def _drop(self, message: Message) -> str | None:
        """Count a dropped message (under ``_lock``); what to log, at most once per ``DROP_LOG_INTERVAL``."""
        kind = _kind_of(message)
        if kind is None:
            return None
        self.drops[kind] += 1
        if self._on_drop is not None:
            self._on_drop(kind)
        now = time.monotonic()
        if self._drop_said_at is not None and now - self._drop_said_at < DROP_LOG_INTERVAL:
            return None
        total = self.dropped
        new, self._drops_said, self._drop_said_at = total - self._drops_said, total, now
        kinds = ", ".join(f"{n} {k}" for k, n in self.drops.items() if n)
        state = "closed" if self.closed.is_set() else "too slow"
        return f"views of {self.experiment[:64]} are {state}: dropped {new} updates ({kinds} in all: the status route)"

    def turn(self) -> None:
        """Handle up to ``TURN`` messages on the calling pool thread, then give the thread back
        (scheduled again at the back of the line if mail is left)."""
        try:
            for _ in range(TURN):
                with self._lock:
                    if not self._inbox:
                        break
                    message = self._inbox.popleft()
                if self._handle(message):
                    return
        except BaseException as exc:  # a bug here must not kill a pool thread every run shares
            self._on_error(f"views of {self.experiment[:64]!r}", exc)
        with self._lock:
            if not self._inbox or self.closed.is_set():
                self._scheduled = False
                return
        self._pool.schedule(self)

    def _handle(self, message: Message) -> bool:
        """Handle one message; True when it closed the writer. The backends open on the first
        message that needs them (again, after a ``Release``)."""
        if not self._opened and not isinstance(message, (Sync, Close, Release)):
            self._open()
        match message:
            case Step(view):
                self._write_step(view)
            case Stream(process, metric, step):
                for target in self._live(LoggingMode.PER_RANK_NO_REDUCE):
                    self._call(target, target.backend.log_stream, metric, step, **_identity(process))
            case Anomaly(record, step):
                for target in self._live(LoggingMode.GLOBAL_REDUCE):
                    self._call(target, target.backend.log_anomaly, record, step)
            case Row(process, row):
                self._write_row(process, row)
            case Log(process, record, step):
                self._write_log(process, record, step)
            case Report():
                self._write_report(message)
            case Sync(done):
                done.set()
            case Close():
                self._close()
                return True
            case Release():
                self._release()
        return False

    def _open(self) -> None:
        self._opened = True
        self.opens += 1
        if self._on_open is not None:
            self._on_open(self)
        self._init_views()

    def _release(self) -> None:
        """Finish the backends and make fresh ones from the config, to open on the next message that
        needs them (a view switched off stays off)."""
        if not self._opened:
            return
        try:
            self._finish_views()
        finally:
            self._opened = False
            if self._on_closed is not None:
                self._on_closed(self)
        for view in self.views:
            if not view.disabled:
                options = self._config[view.name]
                view.backend = get_backend_class(str(options.get("backend", view.name)))(dict(options))

    def _close(self) -> None:
        try:
            if self._opened:
                self._finish_views()
        finally:
            if self._on_closed is not None:
                self._on_closed(self)
            if self._loop is not None:
                self._loop.close()
            with self._lock:
                left, self._inbox = self._inbox, deque()
                self.closed.set()
                said = [line for message in left if (line := self._drop(message)) is not None]
            for line in said:
                log.warning("rankscope sink: %s", line)
            for message in left:  # nobody waits forever on a closed writer
                if isinstance(message, (Report, Sync)):
                    message.done.set()

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

    def _init_views(self) -> None:
        """Init every view, disabling those whose init fails or that turn themselves off, and log which
        are on (the first time: views opened again after a release are not news)."""
        for view in self.views:
            if view.disabled:
                continue
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
        level = logging.INFO if self.opens == 1 else logging.DEBUG
        log.log(level, "rankscope sink: new experiment %s%s: %s", self.experiment[:256], run, where or "no view is on")

    def _finish_views(self) -> None:
        for view in self.views:
            if not view.disabled:
                self._call(view, view.backend.finish)

    def _write_report(self, message: Report) -> None:
        for view in self.views:
            if not view.disabled:
                found = self._answer(view, view.backend.report, message.status)
                if found:
                    message.paths.append(found)
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

    def _live(self, mode: LoggingMode) -> list[_View]:
        return [v for v in self.views if not v.disabled and v.backend.logging_mode is mode]

    def _write_step(self, view: StepView) -> None:
        if view.rewound and not view.late:
            run = f" run {self.run[:64]}" if self.run else ""
            log.warning("rankscope sink: experiment %s%s rewound to step %d", self.experiment[:64], run, view.step)
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
        if self._on_written is not None and view.seq:  # a late update moves neither the frontier nor the attempt
            late = view.late
            self._on_written(view.step, view.seq, -1 if late else view.step, 0 if late else view.attempt)


def _kind_of(message: Message) -> str | None:
    """The kind of data a message carries (``DROP_KINDS``); None for the writer's own control messages."""
    match message:
        case Step(view):
            return "late_updates" if view.late else "step_views"
        case Stream():
            return "streamed_values"
        case Row():
            return "sample_rows"
        case Log():
            return "log_records"
        case Anomaly():
            return "anomaly_records"
    return None
