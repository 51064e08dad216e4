"""File descriptors as a budgeted resource: how the sink splits ``RLIMIT_NOFILE``, and which runs hold theirs.

A run's descriptors (its write-ahead log's segment, its span file, its views' files) are held
only while it is active: opened on demand, given back when it goes quiet, ends, or is the least
recently used holder when another run needs room. The journal of written steps is opened per
line, so it holds none. ``Plan`` splits the process's limit once, at start:

    reserved    = the descriptors open before the sink starts + SERVERS + SPARE + 4 per view thread
    connections = min(1024, (limit - reserved) / 4), for each transport (HTTP and gRPC)
    runs        = limit - reserved - 2 * connections

so the connections both transports may hold, the runs' descriptors and the short-lived opens
(a checkpoint, a report page, a control route reading a file) fit the limit together: at
``ulimit -n 1024`` that is about 220 connections per transport and 440 descriptors for runs, at
20,000 it is 1,024 connections and the rest for runs. ``Descriptors`` keeps the runs within
their share: a run about to use its descriptors ``hold``s them, and when the share is full the
least recently used holders are asked to ``release`` theirs (never blocking: one in use says
no and the next is asked). Running out anyway (another process's ENFILE, a share set by hand)
is a refusal with a reason, counted by ``exhausted`` and logged at most once per
``LOG_INTERVAL``: never a traceback per attempt.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import resource
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger("rankscope.sink")

SERVERS = 48
"""Descriptors the transports hold whatever their load: listening sockets, epoll and wake-up
descriptors, gRPC's event engine."""
SPARE = 64
"""Headroom for short-lived opens (a checkpoint's atomic write, a segment's rotation, a report
page, a control route reading a span file) and for the views still closing after a release."""
MAX_CONNECTIONS = 1024
"""The most connections per transport the plan gives, however high the limit."""
MIN_RUNS = 16
"""The runs' share is at least this, however low the limit (the sink then says it is too low)."""
SCAN = 32
"""Holders one ``hold`` asks at most to release (a share full of runs in use is not walked whole)."""
LOG_INTERVAL = 10.0
"""Seconds between two log lines about running out of descriptors (the others are counted)."""
RETAKEN = 8
"""Rounds a ``hold`` asks again, beyond its three, when the room its victims made went to another
thread's hold meanwhile: a flood from several clients is not refused, and no hold evicts without end."""
LEAVING_WAIT = 2.0
"""Seconds a ``hold`` waits, at most, for holders other threads asked to let go: the room they
make is coming, so it is no reason to refuse."""
OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)


def nofile_limit() -> int:
    """The process's soft ``RLIMIT_NOFILE`` (unlimited counts as 2**20)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1 << 20 if soft == resource.RLIM_INFINITY or soft <= 0 else min(int(soft), 1 << 20)


def open_descriptors() -> int | None:
    """How many descriptors the process holds now (Linux: ``/proc/self/fd``), None where unknown."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the one listing it
    except OSError:
        return None


def out_of_descriptors(exc: BaseException) -> bool:
    """Whether ``exc`` is the process (EMFILE) or the system (ENFILE) out of file descriptors."""
    return isinstance(exc, OSError) and exc.errno in OUT_OF_DESCRIPTORS


@dataclass(frozen=True, slots=True)
class Plan:
    """How the sink splits its descriptor limit (the module's formula)."""

    limit: int
    reserved: int
    connections: int
    """Per transport: the HTTP server's ``max_connections`` and gRPC's incoming connections."""
    runs: int
    """What the runs' descriptors share (``Descriptors.budget``)."""

    @classmethod
    def of(cls, limit: int, base: int | None, *, view_workers: int = 4, max_connections: int | None = None) -> Plan:
        """The split of ``limit`` for a process holding ``base`` descriptors before the sink starts;
        ``max_connections`` set by hand is taken as given."""
        reserved = (64 if base is None else base) + SERVERS + SPARE + 4 * max(1, view_workers)
        free = max(0, limit - reserved)
        connections = max_connections if max_connections is not None else max(16, min(MAX_CONNECTIONS, free // 4))
        return cls(limit, reserved, connections, max(MIN_RUNS, free - 2 * connections))

    @property
    def short(self) -> bool:
        """Whether the limit leaves the runs less than the formula wants (the sink says so at start)."""
        return self.limit - self.reserved - 2 * self.connections < MIN_RUNS


class Holder(Protocol):
    """What holds a run's descriptors: its files (``runs.tenant.Tenant``: its log's segment, its span
    file) or its views (``views.writer.ViewWriter``)."""

    def release(self) -> bool:
        """Close its descriptors now, never waiting for a lock; False when it is in use (ask another)."""
        ...


class Descriptors:
    """The runs' share of the descriptor limit, held least recently used first."""

    def __init__(self, plan: Plan, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.plan = plan
        self.budget = plan.runs
        self.clock = clock
        self._lock = threading.Lock()
        self._answered = threading.Condition(self._lock)
        """Notified when a holder asked to let go has answered (``_release``) or gave its share back."""
        self._held: OrderedDict[Holder, int] = OrderedDict()
        """Holder -> descriptors it holds, least recently used first."""
        self._leaving: set[Holder] = set()
        """Holders asked to let go right now (by another thread's ``hold``)."""
        self.used = 0
        self.peak = 0
        self.released = 0
        """Times a holder gave its descriptors back when asked (another needed them, or it went quiet)."""
        self.refused = 0
        """Holds refused: the share was full of runs in use."""
        self.exhausted_at: dict[str, int] = {}
        """Where the process ran out anyway (``accept``, ``open``), and how often."""
        self._logged = -LOG_INTERVAL
        self._unlogged = 0

    def hold(self, holder: Holder, n: int, *, refusable: bool = True) -> bool:
        """``holder`` is about to open its ``n`` descriptors: it is the most recently used now, and
        the least recently used others give theirs back (physically, before this returns) until
        its fit. False: they are all in use (the caller refuses, with a reason, what needed
        them); ``refusable`` False, or a holder growing: it opens them anyway, over the share.
        Holders other threads asked to let go are waited for (``LEAVING_WAIT``): a flood of new
        runs from several clients could find the oldest holders all leaving, and be refused."""
        rounds, retaken, until = 0, 0, time.monotonic() + LEAVING_WAIT
        while rounds < 3:
            with self._lock:
                held = self._held.pop(holder, None)
                if held is not None:
                    self.used -= held
                victims = self._victims(n) if self.used + n > self.budget else []
                if not victims:
                    if self.used + n <= self.budget or held is not None or not refusable:
                        self._held[holder] = n
                        self.used += n
                        self.peak = max(self.peak, self.used)
                        return True
                    if self._coming(n) and (left := until - time.monotonic()) > 0:
                        self._answered.wait(left)  # their room is coming
                        continue
                    self.refused += 1
                    return False
                if held is not None:  # holding on to what it has while others let go
                    self._held[holder] = held
                    self.used += held
            # Outside the lock: a view's finish may take a while. A round whose victims let go
            # counts only past the wait or ``RETAKEN`` such rounds: the room it made may have gone
            # to another thread's hold (a flood from several clients), and the next round asks
            # the next least recent.
            if self._release(victims) and retaken < RETAKEN and time.monotonic() < until:
                retaken += 1
            else:
                rounds += 1
        return self._last_try(holder, n, refusable)

    def _coming(self, n: int) -> bool:
        """Whether the holders asked to let go would make room for ``n`` (under the lock): only
        then is a hold worth waiting for (it holds its run's lock and a transport's thread)."""
        leaving = sum(self._held.get(holder, 0) for holder in self._leaving)
        return bool(leaving) and self.used - leaving + n <= self.budget

    def _last_try(self, holder: Holder, n: int, refusable: bool) -> bool:
        """After three rounds of asking others: in if it fits, holds already or may not be refused."""
        with self._lock:
            if self.used + n > self.budget and holder not in self._held and refusable:
                self.refused += 1
                return False
            self.used += n - self._held.pop(holder, 0)
            self._held[holder] = n
            self.peak = max(self.peak, self.used)
            return True

    def _victims(self, n: int) -> list[Holder]:
        """The least recently used holders (at most ``SCAN``) whose descriptors would make room for
        ``n`` more, marked as leaving (under the lock)."""
        found: list[Holder] = []
        freed = 0
        for holder in itertools.islice(self._held, SCAN):
            if self.used - freed + n <= self.budget:
                break
            if holder not in self._leaving:
                found.append(holder)
                freed += self._held[holder]
        self._leaving.update(found)
        return found

    def _release(self, victims: list[Holder]) -> int:
        """Ask each to let go now; one in use says no and goes to the back of the line. How many let go."""
        freed = 0
        asked = 0
        try:
            for victim in victims:
                done = False
                asked += 1
                try:
                    done = victim.release()
                finally:  # one that raised is in use: never left "leaving", which holds would wait for
                    with self._lock:
                        self._leaving.discard(victim)
                        if done:
                            self.used -= self._held.pop(victim, 0)  # 0: it said so itself (``forget``)
                            self.released += 1
                            freed += 1
                        elif victim in self._held:
                            self._held.move_to_end(victim)
                        self._answered.notify_all()
        finally:  # one raised: those after it were never asked, so they are not leaving either
            if asked < len(victims):
                with self._lock:
                    self._leaving.difference_update(victims[asked:])
                    self._answered.notify_all()
        return freed

    def let_go(self, holder: Holder) -> bool:
        """``holder`` gives its descriptors back if it holds any and is not in use (it went quiet)."""
        with self._lock:
            if holder not in self._held or holder in self._leaving:
                return False
            self._leaving.add(holder)
        self._release([holder])
        return holder not in self._held

    def forget(self, holder: Holder) -> None:
        """``holder`` gave its descriptors back by itself (quiet, ended, closed)."""
        with self._lock:
            self.used -= self._held.pop(holder, 0)
            self._answered.notify_all()

    def holds(self, holder: Holder) -> int:
        with self._lock:
            return self._held.get(holder, 0)

    def exhausted(self, where: str, exc: BaseException | None = None) -> None:
        """The process ran out of descriptors at ``where`` (``accept``, ``open``): counted, and
        logged at most once per ``LOG_INTERVAL`` with the count of the others."""
        now = self.clock()
        with self._lock:
            self.exhausted_at[where] = self.exhausted_at.get(where, 0) + 1
            if now - self._logged < LOG_INTERVAL:
                self._unlogged += 1
                return
            self._logged, unlogged, self._unlogged = now, self._unlogged, 0
        more = f" ({unlogged} more since the last report)" if unlogged else ""
        log.error(
            "rankscope sink: out of file descriptors at %s (%s)%s: refused with a reason; the limit is %d, "
            "the runs' share %d (see /rankscope/v1/status)",
            where,
            os.strerror(exc.errno) if isinstance(exc, OSError) and exc.errno else "no descriptor left",
            more,
            self.plan.limit,
            self.budget,
        )

    def status(self) -> dict[str, Any]:
        """The status route's overview of descriptors."""
        with self._lock:
            return {
                "limit": self.plan.limit,
                "reserved": self.plan.reserved,
                "connections_per_transport": self.plan.connections,
                "budget": self.budget,
                "held": self.used,
                "peak": self.peak,
                "runs_holding": len(self._held),
                "released_for_others": self.released,
                "refused": self.refused,
                "exhausted": dict(self.exhausted_at),
                "open_now": open_descriptors(),
            }
