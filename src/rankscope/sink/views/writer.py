"""Every run's backends, written on a bounded pool of threads, so a slow or failing view never
stalls ingest, a view stuck in a slow call holds one thread (the pool grows past stuck ones, up
to a bound), and a sink with 300 open runs does not hold 300 threads.

The sink calls the same ``LoggerBackend`` interface the SDK does; extra keyword arguments
say whose values they are: ``per_process`` (global views: every process's values),
``process_name``/``process`` (per-process views and streams), ``late`` (a late update),
``labels`` (global views: the process a value names, e.g. who holds ``{key}/argmax_rank``),
and for global views ``missing`` (labels of processes the step went without), ``phase_times``
(phase → process → seconds), ``step_seconds`` (the step's time, first close to first close; the
first step's from its closer's start) and ``spans`` (a callable giving the step's spans in their
JSONL form: a view that wants them pays for them).

Each run's ``ViewWriter`` holds a bounded inbox of typed messages; the ``ViewPool`` runs a writer
with mail on one of its threads, a few messages at a time, so one run's messages are handled in
order and by one thread at a time, and a busy run takes turns with the others. A writer's
backends open on the first message that needs them and give their files back on ``Release``
(the run went quiet) or when the sink's descriptor budget claims an idle writer (``release``,
on the caller's thread, as a turn would); the next message opens them again.

A writer is put together from parts of its own: its ``inbox.Inbox`` (the bounded queue, its
claims, drops and close), its ``viewset.ViewSet`` (the backends made from the run's config, opened,
released and finished), its ``calls.Calls`` (every call into a backend, guarded) and its
``writes.Writes`` (how each kind of data reaches the views); what the inbox carries is
``messages``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from ...backends.base import Metric
from ...core.anomalies import Anomaly
from ...otlp.samples import SampleRow
from ..checked import LogRecord, OnError, Process
from .calls import Calls
from .fair import FairLine
from .inbox import Inbox
from .messages import DROP_KINDS, Close, Detected, Finalized, Log, Message, Release, Report, Row, Stream, Sync
from .step import StepView
from .viewset import ViewSet
from .writes import Writes, Written

__all__ = ["DROP_KINDS", "TURN", "ViewPool", "ViewWriter", "Written"]

TURN = 32
"""Messages a writer handles before it lets the next run with mail have a thread."""


class ViewPool:
    """The threads that run every writer with mail (``ViewWriter``), one client's after another's
    (``fair``): ``workers`` of them, and one more, up to ``max_workers``, each time every thread
    has been held by one turn for ``stall`` seconds (views stuck in a slow call hold their
    threads; the other runs' views go on)."""

    def __init__(
        self,
        workers: int,
        spawn: Callable[[str, Callable[[], None]], threading.Thread],
        *,
        max_workers: int | None = None,
        stall: float = 5.0,
    ) -> None:
        self._spawn = spawn
        self._ready: FairLine[ViewWriter] = FairLine()
        """Runs with mail, one client's after another's (``fair``)."""
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
        self._ready.put(writer.client, writer)
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
            self._ready.end()
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


class ViewWriter:
    """One run's backends and their inbox, handled on a ``ViewPool`` thread.

    A backend whose ``init`` fails is disabled with one error naming it (W&B without an API
    key, say); one whose writes fail keeps being called, and the status route shows its last
    *successfully* written step and its last error. After each step, ``on_written`` (the run
    log's ``durable.wal.ExperimentLog.written_view``) lets the write-ahead log drop what is now in
    every view. A full inbox drops the message, counted by kind of data (``drops``, ``DROP_KINDS``;
    also what arrives once the writer is closed), handed to ``on_drop`` (the sink's sum) and said
    at most once per ``inbox.DROP_LOG_INTERVAL``. With a write-ahead log, a dropped step's records stay
    in it (its segment is kept) and the sink's next start writes the step again (a late update of
    it when later steps were written); streamed values, streamed sample rows, log records and
    anomaly records are not in the log."""

    def __init__(
        self,
        experiment: str,
        config: Mapping[str, Mapping[str, Any]],
        on_error: OnError,
        pool: ViewPool,
        *,
        max_queued: int = 4096,
        on_written: Written | None = None,
        on_drop: Callable[[str], None] | None = None,
        on_open: Callable[[ViewWriter], object] | None = None,
        on_closed: Callable[[ViewWriter], object] | None = None,
        run: str = "",
        client: str = "",
    ) -> None:
        self.experiment = experiment
        self.run = run
        self.client = client
        """Whose run it is (``edge.ports.Client.quota_key``): the pool serves one client's runs after another's."""
        self._on_error = on_error
        self._inbox = Inbox(experiment, partial(pool.schedule, self), max_queued=max_queued, on_drop=on_drop)
        self.drops = self._inbox.drops
        """Messages dropped (the inbox full, or the writer closed), by kind of data."""
        self.closed = self._inbox.closed
        self._calls = Calls(experiment, on_error)
        self._views = ViewSet(
            experiment,
            config,
            on_error,
            self._calls,
            on_open=None if on_open is None else partial(on_open, self),
            on_closed=None if on_closed is None else partial(on_closed, self),
            run=run,
        )
        """``on_open`` is called before the backends open (again) and ``on_closed`` after they
        finished: the sink's descriptor budget (``durable.descriptors``) counts their files."""
        self.views = self._views.views
        self._writes = Writes(experiment, self.views, self._calls, on_written=on_written, run=run)

    @property
    def descriptors(self) -> int:
        """File descriptors the views hold while open (``LoggerBackend.descriptors``)."""
        return self._views.descriptors

    @property
    def opens(self) -> int:
        """Times the backends opened (again, after a release)."""
        return self._views.opens

    def request_release(self) -> None:
        """Finish the backends after what is queued, giving their files back (``Release``)."""
        self._inbox.put(Release(), always=True)

    def release(self) -> bool:
        """Finish the backends now, on the calling thread, if no turn is running or due (the
        descriptor budget's LRU bound, ``durable.descriptors.Holder``): False, without waiting, when
        one is. What comes after opens them again."""
        match self._inbox.claim():  # claimed, as a turn claims it: no pool thread runs it meanwhile
            case "busy":
                return False
            case "closed":
                return True
        try:
            self._views.release()
        except BaseException as exc:  # a bug here must not reach the caller's request
            self._on_error(f"views of {self.experiment[:64]!r}", exc)
        finally:
            self._inbox.unclaim()
        return True

    @property
    def dropped(self) -> int:
        """Messages dropped, of every kind."""
        return self._inbox.dropped

    def status(self) -> dict[str, Any]:
        return self._views.status()

    def step(self, view: StepView) -> None:
        self._inbox.put(Finalized(view))

    def stream(self, process: Process, metric: Metric, step: int | None) -> None:
        self._inbox.put(Stream(process, metric, step))

    def anomaly(self, record: Anomaly, step: int | None) -> None:
        """An anomaly record outside a step's view (a capture's files, say): global views."""
        self._inbox.put(Detected(record, step))

    def row(self, process: Process, row: SampleRow) -> None:
        """A streamed sample row (``otlp.samples.SampleRow``, every row a process recorded)."""
        self._inbox.put(Row(process, row))

    def log(self, process: Process, record: LogRecord, step: int) -> None:
        """An ordinary OTel log record (``checked.LogRecord``) of ``process``, in ``step``."""
        self._inbox.put(Log(process, record, step))

    def report(self, status: dict[str, Any] | None, timeout: float | None) -> list[str]:
        """Have the views that write a page (the report view) write it after what is queued; with
        a ``timeout``, wait and return where they wrote (else return at once)."""
        message = Report(status)
        self._inbox.put(message, always=True)
        if timeout is None or not message.done.wait(timeout):
            return []
        return message.paths

    def close(self, timeout: float) -> None:
        self.request_close(timeout)
        self.join(timeout)

    def request_close(self, timeout: float = 0.0) -> None:
        """Finish the backends after what is queued (W&B's finish can take seconds)."""
        self._inbox.put(Close(), always=True)

    def join(self, timeout: float) -> bool:
        return self.closed.wait(max(0.0, timeout))

    def wait_idle(self, timeout: float) -> bool:
        message = Sync()
        self._inbox.put(message, always=True)
        return message.done.wait(timeout)

    def turn(self) -> None:
        """Handle up to ``TURN`` messages on the calling pool thread, then give the thread back
        (scheduled again at the back of the line if mail is left)."""
        try:
            for _ in range(TURN):
                message = self._inbox.take()
                if message is None:
                    break
                if self._handle(message):
                    return
        except BaseException as exc:  # a bug here must not kill a pool thread every run shares
            self._on_error(f"views of {self.experiment[:64]!r}", exc)
        self._inbox.turn_over()

    def _handle(self, message: Message) -> bool:
        """Handle one message; True when it closed the writer. The backends open on the first
        message that needs them (again, after a ``Release``)."""
        if not self._views.opened and not isinstance(message, (Sync, Close, Release)):
            self._views.open()
        match message:
            case Sync(done):
                done.set()
            case Close():
                self._close()
                return True
            case Release():
                self._views.release()
            case _:
                self._writes.write(message)
        return False

    def _close(self) -> None:
        try:
            self._views.close()
        finally:
            self._calls.close()
            self._inbox.shut()
