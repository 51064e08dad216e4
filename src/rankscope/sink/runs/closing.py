"""Closing runs: those the upkeep says are done (ended, idle) and those admission chose to make
room (``quotas``).

A closed run is out of the registry at once; its views and log are closed after, by the closer
thread (``finish_closing``: closing a log fsyncs it, and a flood of runs that end must not hold
up the finalizer every run's steps wait for). A reopening of the same run closes them first
(``take_back``). The run book, a tombstone (where its steps go on) and its last status
(``closed``) remember it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ..config import SinkConfig
from .closed import ClosedRuns
from .registry import Tenants
from .runbook import RunKey
from .tenant import Tenant


class Closer:
    """Takes runs out of the registry and closes what they hold."""

    def __init__(
        self,
        registry: Tenants,
        closed: ClosedRuns,
        config: SinkConfig,
        final_status: Callable[[Tenant], dict[str, Any]],
    ) -> None:
        self._registry = registry
        self._closed = closed
        self._stop_timeout = config.stop_timeout
        self._final_status = final_status
        """A closing run's status (``status.RunStatus.of``): its report page's last, and what the
        status route answers for it once closed."""
        self._closing: list[Tenant] = []
        """Runs out of the registry whose views and log are not closed yet (``finish_closing``)."""
        self._closing_now: dict[RunKey, Tenant] = {}
        """The same, and those being closed, by run: a reopening closes them first."""
        self._to_close = threading.Event()

    @property
    def closing(self) -> int:
        """Runs out of the registry whose views and log are still being closed."""
        return len(self._closing_now)

    def close(self, tenant: Tenant) -> bool:
        """Close a run that is done (``upkeep``: ended, idle): out of the registry now, its views
        and log closed by the closer thread (``run``). False if it is busy again (or closed)."""
        with self._registry.lock:
            return self.retire(tenant)

    def retire(self, tenant: Tenant) -> bool:
        """Take a run that may close out of the registry (under the registry lock; never waits for
        the run's own lock): its steps go on where they were if it comes back. ``finish_closing``
        closes its files."""
        if not tenant.lock.acquire(blocking=False):
            return False
        try:
            if tenant.closed or not tenant.closable:
                return False
            tenant.closed = True
            key = tenant.key
            self._registry.remove(key)
            self._closed.bury(key, tenant.book.last_finalized, tenant.book.attempt)
            self._closing.append(tenant)
            self._closing_now[key] = tenant
            self._to_close.set()
            return True
        finally:
            tenant.lock.release()

    def take_back(self, key: RunKey) -> None:
        """Data came back for a run being closed: its files close first, here (under the registry
        lock; not waiting for the closer thread: it may be waiting for that lock)."""
        closing = self._closing_now.pop(key, None)
        if closing is None:
            return
        if closing in self._closing:
            self._closing.remove(closing)
            self._close_views(closing, final=False)  # its status would need the registry's lock
        if closing.writer is not None:  # a moment for its views, not their whole finish
            closing.writer.join(1.0)
        self._close_log(closing)

    def run(self, stop: threading.Event) -> None:
        """The closer thread's loop (started and supervised by the sink)."""
        while not stop.is_set():
            if self._to_close.wait(0.5):
                self._to_close.clear()
                self.finish_closing()

    def finish_closing(self) -> None:
        """Close what the runs taken out of the registry hold: each run's views and descriptors
        first (its views finish after what they have queued), then, once its views finished, its
        log (a checkpoint: it fsyncs), one at a time, closing the views of runs taken out
        meanwhile in between: a flood of runs that end waits on the disk holding no descriptor."""
        logs: deque[Tenant] = deque()
        waiting = 0
        while True:
            with self._registry.lock:
                fresh, self._closing = self._closing, []
            for tenant in fresh:
                self._close_views(tenant)
            logs.extend(fresh)
            if not logs:
                return
            tenant = logs.popleft()
            writer = tenant.writer
            if writer is not None and not writer.closed.is_set() and time.monotonic() < tenant.closing_deadline:
                logs.append(tenant)  # its views still write: its log's journal must cover what they wrote
                waiting += 1
                if waiting >= len(logs):  # every one waits for its views: give them a moment
                    writer.closed.wait(0.05)
                    waiting = 0
                continue
            waiting = 0
            self._close_log(tenant)
            with self._registry.lock:
                if self._closing_now.get(tenant.key) is tenant:
                    del self._closing_now[tenant.key]

    def _close_views(self, tenant: Tenant, final: bool = True) -> None:
        """A closed run's views finish after their page (with the run's last status), its span file
        and log segment close: its descriptors go back. ``final``: keep that status for the status
        route (it reads the registry: not under its lock)."""
        try:
            status = self._final_status(tenant) if final else None
            if status is not None:
                self._closed.keep_status(tenant.key, status)
            if tenant.writer is not None:
                tenant.writer.report(status, None)
                tenant.writer.request_close(self._stop_timeout)
            tenant.closing_deadline = time.monotonic() + self._stop_timeout
            with tenant.lock:
                if tenant.book.traces.file is not None:
                    tenant.book.traces.file.close()
                if tenant.log is not None:
                    tenant.log.release(wait=True)
        except Exception as exc:  # a bug (or a failing disk): this run's, nobody else's
            tenant.failed("closing its views", exc)
        finally:
            self._registry.descriptors.forget(tenant)

    @staticmethod
    def _close_log(tenant: Tenant) -> None:
        """A closed run's log is checkpointed and closed; then a reopening of the run may go on."""
        try:
            with tenant.lock:
                if tenant.log is not None:
                    tenant.log.close()
        except Exception as exc:
            tenant.failed("closing its log", exc)
