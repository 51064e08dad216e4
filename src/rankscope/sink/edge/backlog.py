"""The requests the sink has received and not yet taken: a step's grace is the clients' time, not the sink's.

A step missing a process is finalized without it ``grace`` seconds after its first data. That
grace is meant for a late client or network; but a sink busy with other clients' large requests
(eight senders of a million points each, a box loaded by other jobs) may hold an honest rank's
request received in time in its thread pool for a second or more. Finalized meanwhile, the step
would go out without a rank whose data the sink already had, and stay partial (its late update
carries the late part only).

So each transport holds a request here from when its body is whole until it is answered, and the
finalizer judges a step's grace at ``heard_until()``: the time up to which every request received
has been taken. The backlog holds a grace back by ``MOST`` seconds at most: a sink kept busy longer
than that finalizes as before (the step named partial by its late update), so no client can hold
another experiment's steps open for long. Bytes still in a socket's buffer while the event loop
waits for the CPU are not seen here: the loop's lag is not measured.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from types import TracebackType

MOST = 10.0
"""Seconds the backlog may hold a step's grace back at most."""


class Backlog:
    """``with backlog.held():`` around taking one received request; ``heard_until()`` for the finalizer."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, most: float = MOST) -> None:
        self.clock = clock
        self.most = most
        self._lock = threading.Lock()
        self._since: dict[int, float] = {}
        """Each request held, by when it was received: in that order (a dict keeps its insertion order)."""
        self._ids = itertools.count()

    def held(self) -> _Held:
        """Hold one request, received now, until the ``with`` block ends (answered, refused or failed)."""
        return _Held(self)

    def _hold(self) -> int:
        with self._lock:
            key = next(self._ids)
            self._since[key] = self.clock()
            return key

    def _release(self, key: int) -> None:
        with self._lock:
            del self._since[key]

    def heard_until(self) -> float:
        """The time up to which every request received has been taken (now, when none is held),
        but not more than ``most`` seconds ago."""
        now = self.clock()
        with self._lock:
            oldest = next(iter(self._since.values()), now)
        return max(min(now, oldest), now - self.most)

    def __len__(self) -> int:
        """Requests held now."""
        with self._lock:
            return len(self._since)


class _Held:
    """One request held (a class, not ``contextlib``: the refusals raised through it are frozen)."""

    def __init__(self, backlog: Backlog) -> None:
        self._backlog = backlog
        self._key = -1

    def __enter__(self) -> None:
        self._key = self._backlog._hold()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._backlog._release(self._key)
