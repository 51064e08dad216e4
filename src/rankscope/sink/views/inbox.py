"""A run's inbox of messages for its views (``views.writer.ViewWriter``): bounded, handled by one
thread at a time (a pool thread's turn, or a ``release`` on the caller's thread, claims it), closed
once the views finished.

A full inbox drops the message (a closed one drops everything), counted by kind of data
(``drops``, ``messages.DROP_KINDS``), handed to ``on_drop`` (the sink's sum) and said at most once
per ``DROP_LOG_INTERVAL``; control messages (``put(..., always=True)``: a close, a release, a wait,
a report) are never dropped by a full inbox, and whoever waits on a dropped one is answered.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Literal

from .messages import DROP_KINDS, Message, Report, Sync, kind_of

log = logging.getLogger("rankscope.sink")

DROP_LOG_INTERVAL = 10.0
"""Seconds between two log lines of one run's drops (every drop is counted: the status route)."""


class Inbox:
    """One run's queued messages, whether a turn is running or due (``schedule`` asks the pool for
    one), and what was dropped."""

    def __init__(
        self,
        experiment: str,
        schedule: Callable[[], None],
        *,
        max_queued: int = 4096,
        on_drop: Callable[[str], None] | None = None,
    ) -> None:
        self.experiment = experiment
        self._schedule = schedule
        self._queue: deque[Message] = deque()
        self._max_queued = max_queued
        self._lock = threading.Lock()
        self._scheduled = False
        self.closed = threading.Event()
        self.drops: dict[str, int] = dict.fromkeys(DROP_KINDS, 0)
        """Messages dropped (the inbox full, or closed), by kind of data."""
        self._on_drop = on_drop
        self._drops_said = 0
        self._drop_said_at: float | None = None

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def dropped(self) -> int:
        """Messages dropped, of every kind."""
        return sum(self.drops.values())

    def put(self, message: Message, always: bool = False) -> None:
        """Queue ``message``; a full inbox drops it (``always``: control messages, never dropped)."""
        with self._lock:
            if self.closed.is_set() or (len(self._queue) >= self._max_queued and not always):
                if isinstance(message, (Report, Sync)):
                    message.done.set()
                said = self._drop(message)
                schedule = False
            else:
                said = None
                self._queue.append(message)
                schedule = not self._scheduled
                self._scheduled = True
        if said is not None:
            log.warning("rankscope sink: %s", said)
        if schedule:
            self._schedule()

    def take(self) -> Message | None:
        """The next message of a turn; None when none is left."""
        with self._lock:
            return self._queue.popleft() if self._queue else None

    def turn_over(self) -> None:
        """A turn ended (its claim is given up): scheduled again, at the back of the line, if mail is left."""
        with self._lock:
            if not self._queue or self.closed.is_set():
                self._scheduled = False
                return
        self._schedule()

    def claim(self) -> Literal["busy", "closed", "claimed"]:
        """Claim it on the calling thread, as a turn claims it (no pool thread runs it meanwhile):
        ``busy`` when a turn is running or due, ``closed`` (not claimed) when it is closed."""
        with self._lock:
            if self._scheduled:
                return "busy"
            if self.closed.is_set():
                return "closed"
            self._scheduled = True
            return "claimed"

    def unclaim(self) -> None:
        """Give up a ``claim``: scheduled if mail came meanwhile."""
        with self._lock:
            self._scheduled = again = bool(self._queue)
        if again:
            self._schedule()

    def shut(self) -> None:
        """Close it: what is left is dropped (counted), and whoever waits on it is answered."""
        with self._lock:
            left, self._queue = self._queue, deque()
            self.closed.set()
            said = [line for message in left if (line := self._drop(message)) is not None]
        for line in said:
            log.warning("rankscope sink: %s", line)
        for message in left:  # nobody waits forever on a closed writer
            if isinstance(message, (Report, Sync)):
                message.done.set()

    def _drop(self, message: Message) -> str | None:
        """Count a dropped message (under ``_lock``); what to log, at most once per ``DROP_LOG_INTERVAL``."""
        kind = kind_of(message)
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
