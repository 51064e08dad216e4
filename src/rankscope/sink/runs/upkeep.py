"""The finalizer's rounds: only the runs with work are visited, and runs that are done let go.

Every ``tick`` the finalizer visits the runs on its ``Agenda``: those that took data since the
last tick (woken by ingest), and those whose next deadline came (a heap of times: a step's
grace, a late update, the moment a run goes quiet, ends or idles). A sink holding thousands of
runs that send nothing does nothing for them until one of their deadlines: its idle cost does
not grow with the runs it holds.

A visit finalizes what is due (the coordinator's ``finalize``), then lets go of what the run no
longer needs (``RunLimits``):

- a run all of whose processes said goodbye is closed once every step it took is finalized and
  ``grace`` seconds (and a margin) passed (the run book then refuses its id's reuse,
  ``runs.runbook``): its views finish after writing them, then its log closes; the run book and
  the closed run's status remember it;
- a run without data for ``quiet_after`` seconds gives its file descriptors back
  (``Tenants.release``: its files, its views); they open again on its next data;
- a run without data for ``idle_timeout`` seconds, nothing open, is closed.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from ..config import RunLimits
from .closing import Closer
from .registry import Tenants
from .tenant import Tenant

T = TypeVar("T", bound=Hashable)

RECHECK = 0.25
"""Seconds until a run due to close but busy (a step open, data just in) is looked at again."""
ENDED_MARGIN = 1.0
"""Seconds past the run book's ``linger`` (the sink's grace) before an ended run closes: by then
the run book refuses its id's reuse, and a process that was merely late came in time for the
step it was late for (its states still retained)."""


class Agenda(Generic[T]):
    """Which items are due a visit: those woken since the last look, and those whose time came."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._woken: dict[T, None] = {}
        self._heap: list[tuple[float, int, T]] = []
        self._at: dict[T, float] = {}
        """Each scheduled item's earliest time (an entry of the heap at another time is stale)."""
        self._order = itertools.count()

    def wake(self, item: T) -> None:
        """Visit ``item`` on the next look."""
        with self._lock:
            self._woken[item] = None

    def at(self, item: T, when: float) -> None:
        """Visit ``item`` once ``when`` comes (an earlier time already asked for stands)."""
        with self._lock:
            if when < self._at.get(item, float("inf")):
                self._at[item] = when
                heapq.heappush(self._heap, (when, next(self._order), item))

    def forget(self, item: T) -> None:
        with self._lock:
            self._at.pop(item, None)
            self._woken.pop(item, None)

    def due(self, now: float) -> list[T]:
        """The items to visit now, each once; they are scheduled no more (a visit asks again)."""
        with self._lock:
            found, self._woken = self._woken, {}
            while self._heap and self._heap[0][0] <= now:
                when, _, item = heapq.heappop(self._heap)
                if self._at.get(item) == when:
                    del self._at[item]
                    found[item] = None
            for item in found:
                self._at.pop(item, None)  # visited now: its later entries are stale
            return list(found)

    def __len__(self) -> int:
        """Items scheduled."""
        with self._lock:
            return len(self._at)


class Upkeep:
    """The finalizer's round over the agenda (the module docstring)."""

    def __init__(
        self,
        tenants: Tenants,
        closer: Closer,
        finalize: Callable[[Tenant], None],
        *,
        limits: RunLimits,
        grace: float,
        clock: Callable[[], float],
    ) -> None:
        self.tenants = tenants
        self.closer = closer
        self.finalize = finalize
        self.limits = limits
        self.grace = grace
        self.clock = clock
        self.agenda: Agenda[Tenant] = Agenda()
        self.visits = 0
        self.released = 0
        """Runs that gave their descriptors back for going quiet."""

    def wake(self, tenant: Tenant) -> None:
        """``tenant`` took data: the next round visits it."""
        self.agenda.wake(tenant)

    def round(self) -> None:
        """Visit the runs that are due (those closed are closed by ``Closer.run``)."""
        now = self.clock()
        for tenant in self.agenda.due(now):
            self.visits += 1
            self._visit(tenant, now)

    def _visit(self, tenant: Tenant, now: float) -> None:
        if tenant.closed:
            return
        e = tenant.book
        with tenant.lock:
            deadline = e.next_deadline()
            due = tenant.dirty or (deadline is not None and now >= deadline)
        if due:
            self.finalize(tenant)
        next_time = self._let_go(tenant, now)
        with tenant.lock:
            if tenant.closed:
                return
            times = [e.next_deadline(), next_time]
        self.agenda.at(tenant, min(t for t in times if t is not None))

    def _let_go(self, tenant: Tenant, now: float) -> float:
        """Close or release what the run no longer needs; when to look at it again for that."""
        limits = self.limits
        e = tenant.book
        quiet = now - e.last_activity
        if limits.close_ended and tenant.ended:
            after = self.grace + ENDED_MARGIN
            if quiet < after:
                return e.last_activity + after
            if tenant.closable and self.closer.close(tenant):
                return now
            return now + RECHECK  # a step still open, or not yet handed to its views
        times = []
        if quiet >= limits.idle_timeout:
            if tenant.closable and self.closer.close(tenant):
                return now
            times.append(now + RECHECK)
        else:
            times.append(e.last_activity + limits.idle_timeout)
        if quiet < limits.quiet_after:
            times.append(e.last_activity + limits.quiet_after)
        elif self.tenants.release(tenant):
            self.released += 1
        return min(times)
