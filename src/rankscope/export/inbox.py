"""The export thread's inbox: callers hand off without a lock or a system call.

A ``queue.Queue.put`` takes a lock and wakes the consumer through a condition variable: a futex
call on the training thread at every ``flush``, and a thread switch it pays for in cache misses.
Here a caller appends to a deque (atomic under the GIL) and wakes the export thread only when that
thread sleeps with nothing to do (``idle``) or the message cannot wait (``urgent``: a
``force_flush``, a shutdown, a parent's poll). While steps come faster than the export cadence the
thread has work pending and wakes on its own timer, so a training loop never pays for a wake-up.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class Inbox(Generic[T]):
    """Messages for one consumer thread, bounded (an urgent message is never refused)."""

    def __init__(self, limit: int) -> None:
        self._items: deque[T] = deque()
        self._limit = limit
        self._wake = threading.Event()
        self._idle = False

    def put(self, item: T, urgent: bool = False) -> bool:
        """Hand ``item`` over (any thread); False when the inbox is full."""
        if not urgent and len(self._items) >= self._limit:
            return False
        self._items.append(item)
        if urgent or self._idle:
            self._wake.set()
        return True

    def take(self, wait: float, idle: bool, most: int) -> list[T]:
        """(The consumer.) Up to ``most`` messages, waiting up to ``wait`` seconds when none is there;
        ``idle``: the consumer has nothing else to do, so any new message wakes it."""
        items = self._items
        if not items and wait > 0:
            self._idle = idle
            if not items:  # read after publishing ``idle``: a put in between has already woken us or is seen here
                self._wake.wait(wait)
            self._idle = False
            self._wake.clear()
        taken: list[T] = []
        while items and len(taken) < most:
            taken.append(items.popleft())
        return taken

    def snapshot(self) -> tuple[T, ...]:
        """The messages waiting (one atomic copy; a stuck consumer's shutdown counts what is lost)."""
        return tuple(self._items)

    def __len__(self) -> int:
        return len(self._items)
