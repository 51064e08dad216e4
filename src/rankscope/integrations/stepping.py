"""A framework's own step as rankscope's, for integrations that only see step numbers go by.

torchtitan (and frameworks like it) report "step N" at some point inside step N, possibly more than once.
``StepFollower.follow(N)`` closes the step in progress when a later one shows up, so everything a
step records, logs and traces shares its number; ``close`` closes the last one.
"""

from __future__ import annotations

import threading

from ..api import flush, set_step
from ..core import runtime as _slot


class StepFollower:
    """Follows one process's framework step: one per process, shared by the framework's hooks."""

    def __init__(self) -> None:
        self._open: int | None = None
        self._lock = threading.Lock()

    def follow(self, step: object) -> None:
        """``step`` is in progress (ignored unless it is an int later than the one in progress)."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            return
        with self._lock:
            if self._open is not None and step <= self._open:
                return
            if self._open is not None:
                flush(self._open)
            self._open = step
            set_step(step)

    def close(self) -> None:
        """Close the step in progress, if any (the end of training; never after rankscope's own
        shutdown, which would start it again)."""
        with self._lock:
            step, self._open = self._open, None
            if step is not None and _slot.current is not None:
                flush(step)
