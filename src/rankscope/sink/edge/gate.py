"""How many calls the sink takes at once, and how much work: every export and capture upload passes this gate.

Past ``max_in_flight`` calls in progress, or once the sink is stopping, a call is refused with
``OverloadedError`` of kind CAPACITY (or STOPPING), answered as ``edge.errors.ANSWERS`` says.

A call then weighs what it costs (``Call.weigh``: the points of its body, a span or log record
counting as several, walked before any of it is decoded: ``edge.cost``). Calls within their share
(``max_points_in_flight / max_in_flight`` points: the SDK's requests) always pass: all the calls the
gate lets in weigh ``max_points_in_flight`` at most. Larger ones (a gateway's, an attacker's) share
``max_points_in_flight`` between them: past it a call is answered retry-later (CAPACITY) before it
costs anything more, one larger than the whole budget passing alone. Eight clients sending a
million empty points each at once took 28 s an answer and 1.9 GB; now two are taken at a time and
the others retry (peak 580 MB), and an honest experiment beside them keeps its pace
(docs/sink.md, "Limits"; ``tests/integration/test_sink_request_cost.py``).
"""

from __future__ import annotations

import sys
import threading
from contextvars import ContextVar, Token
from types import TracebackType

from .errors import Kind, OverloadedError


class Call:
    """One call let in by the gate, and the points it weighs until it leaves (``edge.cost.Weigh``)."""

    def __init__(self, gate: Gate) -> None:
        self._gate = gate
        self.share = gate.share
        self.weight = 0
        """Points this call holds of the shared budget (0 while within its share)."""
        self.token: Token[Call | None] | None = None

    def room(self) -> int:
        """The most points this call may weigh now without being refused."""
        return self._gate.room(self)

    def weigh(self, points: int) -> bool:
        """Hold ``points`` until the call leaves (instead of what it held), or False when they do not
        fit in the budget now (the call holds what it held: its client should retry later)."""
        return self._gate.weigh(self, points)


_CALL: ContextVar[Call | None] = ContextVar("rankscope_sink_call", default=None)
"""The call in progress on this thread (a call runs on one thread: a gRPC worker, the HTTP pool's)."""


class Gate:
    """``with gate as call:`` counts one call in flight; over capacity (or stopping) raises
    ``OverloadedError``; ``call.weigh(points)`` holds its points of ``max_points_in_flight``."""

    def __init__(self, max_in_flight: int, stopping: threading.Event, max_points_in_flight: int = 0) -> None:
        self.max_in_flight = max_in_flight
        self.max_points_in_flight = max_points_in_flight
        """0: calls are not weighed."""
        self.share = max_points_in_flight // max(1, max_in_flight) if max_points_in_flight else sys.maxsize
        """Points a call may weigh without holding any of the shared budget."""
        self._stopping = stopping
        self._in_flight = 0
        self._held = 0
        """Points held by the calls over their share."""
        self._lock = threading.Lock()

    def __enter__(self) -> Call:
        with self._lock:
            if self._stopping.is_set():
                raise OverloadedError(Kind.STOPPING, "the sink is stopping")
            if self._in_flight >= self.max_in_flight:
                raise OverloadedError(Kind.CAPACITY, "the sink is at capacity")
            self._in_flight += 1
        call = Call(self)
        call.token = _CALL.set(call)
        return call

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        call = _CALL.get()
        with self._lock:
            self._in_flight -= 1
            if call is not None:
                self._held -= call.weight
        if call is not None and call.token is not None:
            _CALL.reset(call.token)

    def room(self, call: Call) -> int:
        """The most points ``call`` may weigh now: its share, or what the others over theirs leave of
        the budget; any number when none is (so one call larger than the budget passes alone)."""
        with self._lock:
            others = self._held - call.weight
        return sys.maxsize if others <= 0 else max(self.share, self.max_points_in_flight - others)

    def weigh(self, call: Call, points: int) -> bool:
        """``call`` holds ``points`` (within its share: none of the budget), or False if they do not fit."""
        weight = points if points > self.share else 0
        with self._lock:
            others = self._held - call.weight
            if weight and others > 0 and others + weight > self.max_points_in_flight:
                return False
            self._held = others + weight
            call.weight = weight
        return True

    @property
    def held(self) -> int:
        """Points held of the budget now, by the calls over their share."""
        return self._held
