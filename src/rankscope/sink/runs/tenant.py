"""One open run at the sink (``Tenant``): its step book, log, captures and views, and the lock that guards them.

A tenant's lock guards its run only; the registry's (``registry``) guards which runs are open and is
never held while a run merges. A run's file descriptors (``durable.descriptors``) are held by its
tenant (its log's segment, its span file: ``hold`` before they are used) and by its view writer
(its views' files, held as they open): each lets go when the run goes quiet or another run needs
them, and opens again on next use.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from ..book.step_book import StepBook
from ..checked import OnError, Refusals, ResourceBatch
from ..durable.wal import ExperimentLog
from ..views.captures import CaptureBook
from ..views.writer import ViewWriter
from .disk import Claim
from .runbook import RunKey

RECENT_STEPS = 64
"""Finalized steps a run keeps for people watching live (``/rankscope/v1/recent``)."""


class Tenant:
    """One run of an experiment at the sink: its state, its views, its log, and the lock that guards them."""

    def __init__(
        self,
        book: StepBook,
        log: ExperimentLog | None,
        captures: CaptureBook,
        on_error: OnError,
        *,
        client: str = "",
        claim: Claim | None = None,
    ) -> None:
        self.book = book
        """The run's step book."""
        self.log = log
        self.captures = captures
        """Profiler captures asked of the run's processes (``views.captures``)."""
        self.lock = threading.Lock()
        self.writer: ViewWriter | None = None
        self.dirty = False
        self.errors = 0
        self.last_error: str | None = None
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_STEPS)
        """The last finalized steps, for people watching live (``/rankscope/v1/recent``)."""
        self.meta_lock = threading.Lock()
        self.meta_version = -1
        """The run record's version last saved (``Opener.save_meta``): an older one is never written over it."""
        self.client = client
        """The client that opened it (``edge.ports.Client.quota_key``): whose quota it counts against."""
        self.claim = claim if claim is not None else Claim()
        """What holds its disk reservation until its views are charged (``disk``)."""
        self.need = (log is not None) + (book.traces.file is not None)
        """File descriptors its files hold while it takes data: its log's segment, its span file."""
        self.releases = 0
        """Times it gave its descriptors back (quiet, or another run needed them)."""
        self.closed = False
        """Out of the registry: a request that finds it so resolves its run again."""
        self.closing_deadline = 0.0
        """When its log closes even if its views have not finished (``Closer.finish_closing``)."""
        self._on_error = on_error

    @property
    def key(self) -> RunKey:
        return (self.book.id, self.book.run)

    @property
    def name(self) -> str:
        """How logs name the run (``StepBook.name``)."""
        return self.book.name

    @property
    def ended(self) -> bool:
        """The run's current attempt is over: every process of it said goodbye and every rank slot it
        declared was held (``Roster.finished``; a rank that never reported may still come, late)."""
        return self.book.roster.finished

    @property
    def closable(self) -> bool:
        """It may close without losing anything: every step it took finalized and handed to its
        views (which write them before they close, and its log closes after them)."""
        return not self.dirty and self.book.settled

    def release(self) -> bool:
        """Close the run's files now: its log's segment, its span file (its views are a holder of
        their own, ``views.writer.ViewWriter``); each opens again on next use. Never waits for a
        lock: False when the run is in use (``durable.descriptors.Holder``)."""
        if not self.lock.acquire(blocking=False):
            return False
        try:
            if self.closed:
                return True
            if self.log is not None and not self.log.release():
                return False
            if self.book.traces.file is not None:
                self.book.traces.file.release()
            self.releases += 1
            return True
        finally:
            self.lock.release()

    def failed(self, where: str, exc: BaseException) -> None:
        """A failure inside this run: counted in its status, logged once (then every 1000th)."""
        self.errors += 1
        self.last_error = f"{where}: {type(exc).__name__}: {exc}"[:500]
        if self.errors == 1 or self.errors % 1000 == 0:
            self._on_error(f"{self.book.name[:96]}: {where}", exc)

    def replayed(self, batch: ResourceBatch, refused: Refusals, seq: int) -> None:
        """A record of the run's write-ahead log merged again (``durable.replay``)."""
        self.book.apply(batch, refused, seq=seq, replayed=True)
        self.book.remember(batch.digest)
