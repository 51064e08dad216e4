"""Per-second rates of counts recorded during a step, computed at each flush."""

from __future__ import annotations

import time
from collections.abc import Callable

from . import recording
from .reduce import Reduce

_SUM = Reduce.SUM


_meters: list[RateMeter] = []


def reset_rates() -> None:
    for meter in _meters:
        meter.reset()


class RateMeter:
    """``add(n)`` on the hot path; at each flush, records ``key`` = count / seconds since the
    previous flush (or since the first ``add``). Reduced with SUM across processes, so the
    global view is the whole job's rate. ``clock`` is a seam for tests (seconds, monotonic)."""

    __slots__ = ("clock", "count", "key", "on_rate", "since")

    def __init__(
        self, key: str, on_rate: Callable[[float], None] | None = None, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.key = key
        self.clock = clock
        self.count = 0.0
        self.since: float | None = None
        self.on_rate = on_rate
        _meters.append(self)

    def reset(self) -> None:
        """Forget the rate (``shutdown``): the next ``add`` starts a new one."""
        self.since, self.count = None, 0.0
        recording.remove_flush_hook(self.at_flush)

    def add(self, n: float) -> None:
        if self.since is None:
            self.since = self.clock()
            recording.add_flush_hook(self.at_flush)
        self.count += n

    def at_flush(self) -> None:
        now = self.clock()
        since, count = self.since, self.count
        self.since, self.count = now, 0.0
        if since is None or now <= since:
            return
        rate = count / (now - since)
        recording.record_metric(self.key, rate, _SUM)
        if self.on_rate is not None:
            self.on_rate(rate)
