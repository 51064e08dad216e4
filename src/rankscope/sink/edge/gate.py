"""How many calls the sink takes at once: every export and capture upload passes this gate.

Past ``max_in_flight`` calls in progress, or once the sink is stopping, a call is refused with
``OverloadedError`` of kind CAPACITY (or STOPPING), answered as ``edge.errors.ANSWERS`` says.
"""

from __future__ import annotations

import threading
from types import TracebackType

from .errors import Kind, OverloadedError


class Gate:
    """``with gate:`` counts one call in flight; over capacity (or stopping) raises ``OverloadedError``."""

    def __init__(self, max_in_flight: int, stopping: threading.Event) -> None:
        self.max_in_flight = max_in_flight
        self._stopping = stopping
        self._in_flight = 0
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        with self._lock:
            if self._stopping.is_set():
                raise OverloadedError(Kind.STOPPING, "the sink is stopping")
            if self._in_flight >= self.max_in_flight:
                raise OverloadedError(Kind.CAPACITY, "the sink is at capacity")
            self._in_flight += 1

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        with self._lock:
            self._in_flight -= 1
