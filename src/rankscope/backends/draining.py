"""What a view that sends from a thread of its own shares: the thread's wait, its last drain's
deadline, and its outage said once.

The MLflow and OTLP views append to a buffer and return; their thread sends, so that a server
that is down or slow never holds up the sink's view thread. ``Draining`` is the part they share:
the condition the buffer and the thread wait on; ``begin_close`` (nothing more is taken, and every
attempt and backoff ends by a deadline, so that several views drain at once within the sink's stop
timeout); ``wait_closed``; ``sleep`` (a backoff that a close ends); and ``down`` / ``up``, which
say an outage once when it starts and once when it ends, with what was dropped during it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("rankscope")


class Draining:
    def __init__(self, *, view: str, name: str, where: str, holds: str, dropped: Callable[[], int]) -> None:
        self._cond = threading.Condition()
        self._closing = False
        self._deadline = float("inf")
        self.name = name
        """Whose view (the experiment and run), for the log."""
        self._view = view
        self._where = where
        """The server, as the log names it."""
        self._holds = holds
        """What the buffer holds at most, in words (``600 steps``)."""
        self._dropped = dropped
        self.down_since: float | None = None
        self._dropped_at_down = 0
        self.last_error: str | None = None

    def begin_close(self, timeout: float) -> None:
        """Take nothing more, and send what is buffered within ``timeout`` seconds from now (the
        first call sets the deadline); ``wait_closed`` then waits for it."""
        with self._cond:
            if not self._closing:
                self._closing = True
                self._deadline = time.monotonic() + timeout
            self._cond.notify_all()

    def wait_closed(self, thread: threading.Thread) -> None:
        """Wait for the sending thread until the deadline (and a second more)."""
        thread.join(max(0.0, self._deadline - time.monotonic()) + 1.0)

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds``, or until the deadline (``begin_close`` may set it meanwhile)."""
        end = time.monotonic() + seconds
        with self._cond:
            while (left := min(end, self._deadline) - time.monotonic()) > 0:
                self._cond.wait(left)

    def down(self, why: str) -> None:
        """An attempt found the server away: said once, when the outage starts."""
        self.last_error = why
        if self.down_since is None:
            self.down_since = time.time()
            self._dropped_at_down = self._dropped()
            log.warning(
                "rankscope: %s does not answer (%s): the %s view of %s keeps up to %s and retries",
                self._where,
                why[:200],
                self._view,
                self.name,
                self._holds,
            )

    def up(self, unit: str) -> None:
        """An attempt went through: the end of an outage, said once, with what it dropped (``unit``)."""
        if self.down_since is not None:
            log.warning(
                "rankscope: %s answers again after %.0f s (the %s view of %s dropped %d %s meanwhile)",
                self._where,
                time.time() - self.down_since,
                self._view,
                self.name,
                self._dropped() - self._dropped_at_down,
                unit,
            )
            self.down_since = None
