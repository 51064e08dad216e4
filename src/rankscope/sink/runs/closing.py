"""Closing runs: those the upkeep says are done (ended, idle) and those admission chose to make
room (``quotas``).

A closed run is out of the registry at once; its views and log are closed after, by the closer
thread (``finish_closing``: closing a log fsyncs it, and a flood of runs that end must not hold
up the finalizer every run's steps wait for). A reopening of the same run closes them first
(``take_back``). The run book, a tombstone (where its steps go on) and its last status
(``closed``) remember it.

With a state directory, a run whose log is ``covered`` once its views finished (every record in
a written view: nothing to replay) is retired, in batches: its log closes without a checkpoint,
what must survive of it (its tombstone, run book record and last status) goes to the store of
retired runs with one fsync for the whole batch (``ClosedRuns.save``), and only then, under the
registry's lock (no reopening of the run meanwhile), its directory is removed
(``ExperimentLog.remove``). A SIGKILL anywhere in between leaves either the directory (replayed
on start as any run's, nothing in it left to replay: retired then) or the store's entry and a
directory without ``meta.json`` (cleared on start): nothing acknowledged is lost. A run whose
views did not finish in time keeps its directory, checkpointed, as before, and its disk
reservation until they finish (then what they wrote is charged: ``runs.disk``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from ..config import SinkConfig
from ..views.writer import ViewWriter
from .closed import ClosedRuns
from .disk import Claim
from .registry import Tenants
from .runbook import RunKey
from .tenant import Tenant

log = logging.getLogger("rankscope.sink")

SETTLE_TIMEOUT = 60.0
"""Seconds at least that a closed run's views may go on writing before what they hold is charged
anyway (a hung backend must not hold its client's reservation, nor its pool slot's, for ever)."""


class Unsettled(NamedTuple):
    """A closed run whose views still write: what charging it needs, not the run itself (its steps
    and spans are let go)."""

    claim: Claim
    client: str
    writer: ViewWriter | None
    name: str
    until: float
    """When it is charged even if its views have not finished (``SETTLE_TIMEOUT``)."""


class Closer:
    """Takes runs out of the registry and closes what they hold."""

    def __init__(
        self,
        registry: Tenants,
        closed: ClosedRuns,
        config: SinkConfig,
        final_status: Callable[[Tenant], dict[str, Any]],
        on_error: Callable[[str, BaseException], None],
    ) -> None:
        self._registry = registry
        self._closed = closed
        self._stop_timeout = config.stop_timeout
        self._final_status = final_status
        self._on_error = on_error
        """The sink's internal errors (logged, and counted in the status route)."""
        """A closing run's status (``status.RunStatus.of``): its report page's last, and what the
        status route answers for it once closed."""
        self._closing: list[Tenant] = []
        """Runs out of the registry whose views and log are not closed yet (``finish_closing``)."""
        self._closing_now: dict[RunKey, Tenant] = {}
        """The same, and those being closed, by run: a reopening closes them first."""
        self._to_close = threading.Event()
        self._unsettled: list[Unsettled] = []
        """Closed runs whose views had not finished (their log closed at ``stop_timeout``): their
        disk reservation holds until the views finish, then what they wrote is charged (``_settle``).
        Charged earlier, a page still being written under a loaded pool was measured short and the
        client's next runs were admitted past its budget. Guarded by ``_settling``: ``stop`` may
        finish the closing while a closer thread that did not join in time still runs."""
        self._settling = threading.Lock()
        self._uncharged: set[Claim] = set()
        """Claims of the runs taken out of the registry whose views' bytes are not charged yet, from
        their retirement to their charge (the status route's ``settling_runs``). Counted from the
        list of runs waiting to be charged only, it read 0 while a page was still being written, and a
        test found the disk charge a page short."""
        self._settle_timeout = max(SETTLE_TIMEOUT, 10 * config.stop_timeout)

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
            with self._settling:
                self._uncharged.add(tenant.claim)
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
        if closing in self._closing:  # not reached by finish_closing: charged from here
            self._closing.remove(closing)
            self._close_views(closing, final=False)  # its status would need the registry's lock
            until = time.monotonic() + self._settle_timeout
            with self._settling:  # left out, its reservation was held for ever: a client lost 5 MiB a time
                self._unsettled.append(Unsettled(closing.claim, closing.client, closing.writer, closing.name, until))
        if closing.writer is not None:  # a moment for its views, not their whole finish
            closing.writer.join(1.0)
        self._close_log(closing)

    def run(self, stop: threading.Event) -> None:
        """The closer thread's loop (started and supervised by the sink)."""
        while not stop.is_set():
            if self._to_close.wait(0.1):  # a stop is seen within 0.1 s (the finalizer ticks more often)
                self._to_close.clear()
                self.finish_closing()
            if self._unsettled:
                self._settle()

    def finish_closing(self) -> None:
        """Close what the runs taken out of the registry hold: each run's views and descriptors
        first (its views finish after what they have queued), then, once its views finished, its
        log, those ready together (``_close_logs``: a batch retires with one fsync), closing the
        views of runs taken out meanwhile in between: a flood of runs that end waits on the disk
        holding no descriptor."""
        logs: list[Tenant] = []
        while True:
            with self._registry.lock:
                fresh, self._closing = self._closing, []
            for tenant in fresh:
                self._close_views(tenant)
            logs.extend(fresh)
            if not logs:
                self._save()  # what was kept since (as a rule nothing): durable before the closer sleeps
                return
            now = time.monotonic()
            ready = [t for t in logs if t.writer is None or t.writer.closed.is_set() or now >= t.closing_deadline]
            if not ready:  # every one waits for its views (its log's journal must cover what they wrote)
                writer = logs[0].writer
                assert writer is not None
                writer.closed.wait(0.05)
                continue
            done = set(ready)
            logs = [t for t in logs if t not in done]
            until = now + self._settle_timeout
            with self._settling:
                self._unsettled += [Unsettled(t.claim, t.client, t.writer, t.name, until) for t in ready]
            self._settle()
            self._close_logs(ready)

    @property
    def settling(self) -> int:
        """Runs out of the registry not charged yet (their views still write, or are being
        measured): their disk reservation is held until then."""
        with self._settling:
            return len(self._uncharged)

    def _settle(self) -> None:
        """What the views of closed runs wrote, charged to their clients (``disk``: each view's
        location measured) once the views finished, or once they have run ``_settle_timeout`` past
        their run's close (a hung backend: charged what they hold then, said once); the others wait,
        their reservation held."""
        with self._settling:
            unsettled, self._unsettled = self._unsettled, []
        now, waiting = time.monotonic(), []
        for run in unsettled:
            writer = run.writer
            if writer is not None and not writer.closed.is_set() and now < run.until:
                waiting.append(run)
                continue
            try:
                self._charge(run)
            except Exception as exc:  # a bug (or a failing disk): this run's reservation goes back, the others go on
                self._on_error(f"charging what the views of {run.name[:96]!r} wrote", exc)
                self._registry.disk.forget(run.claim)
        with self._settling:
            self._unsettled += waiting
            self._uncharged -= {run.claim for run in unsettled} - {run.claim for run in waiting}

    def _charge(self, run: Unsettled) -> None:
        """What a closed run's views hold, charged to its client in place of its reservation."""
        writer = run.writer
        if writer is not None and not writer.closed.is_set():
            log.warning(
                "rankscope sink: the views of %s had not finished %.0f s after the run closed: charged what they "
                "hold now",
                run.name[:96],
                self._settle_timeout,
            )
        views = writer.status() if writer is not None else {}
        found = [str(v.get("location") or "") for v in views.values()]
        self._registry.disk.settle(run.claim, run.client, [w for w in found if w.startswith("/")])

    def close_found(self, tenants: list[Tenant]) -> None:
        """Runs found in the state directory on start with nothing to replay: closed at once, as the
        sink had closed them (or would have), and retired."""
        with self._registry.lock:
            for tenant in tenants:
                tenant.closed = True
                self._closed.bury(tenant.key, tenant.book.last_finalized, tenant.book.attempt, closed=False)
                self._closing_now[tenant.key] = tenant
        self._close_logs(tenants)

    def _close_logs(self, tenants: list[Tenant]) -> None:
        """Close the logs of runs whose views finished; retire those with nothing left to replay (the
        module docstring: the store's entries durable first, then the directories go)."""
        covered = [tenant for tenant in tenants if self._close_log(tenant)]
        with self._registry.lock:
            retiring = {t for t in covered if self._closing_now.get(t.key) is t and self._closed.retire(t.key)}
        if not self._save():
            retiring = set()  # their directories stay: replayed on start (nothing in them), retired then
        with self._registry.lock:
            for tenant in tenants:
                if self._closing_now.get(tenant.key) is not tenant:
                    continue  # it opened again meanwhile: its directory is the new log's
                if tenant in retiring and tenant.log is not None:
                    try:
                        tenant.log.remove()
                    except OSError as exc:  # what is left is cleared on start
                        log.error("rankscope sink: removing %s: %r", tenant.log.directory, exc)
                del self._closing_now[tenant.key]

    def _save(self) -> bool:
        """What closed runs left, durable (``ClosedRuns.save``); False when the disk refused."""
        try:
            self._closed.save()
        except OSError as exc:
            log.error("rankscope sink: the store of retired runs was not written: %r", exc)
            return False
        return True

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
            with tenant.lock:
                tenant.book.steps.retained.let_go()  # its kept steps' bytes go back to the sink's

    @staticmethod
    def _close_log(tenant: Tenant) -> bool:
        """A closed run's log is closed, checkpointed unless it is ``covered`` (its directory is to go);
        then a reopening of the run may go on. Whether it was covered."""
        try:
            with tenant.lock:
                if tenant.log is None:
                    return False
                covered = tenant.log.covered()
                tenant.log.close(checkpoint=not covered)
                return covered
        except Exception as exc:
            tenant.failed("closing its log", exc)
            return False
