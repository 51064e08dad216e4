"""Steps for data that has none: each step's wall-clock window, or fixed time buckets.

* A step's window ends when its first process closes it (the flush marker's time; windows
  never go back). The run's first window starts when the step began for that process (its
  marker's start: its previous flush, else its start), so the first step has a time too. A
  point or span without a step joins the step whose window holds its timestamp, or the step
  after the newest window when it is newer than all of them.
* A run none of whose processes steps gets fixed time buckets instead (``time_bucket``
  seconds): bucket N is step N counted from the run's first bucket, and is final
  ``time_bucket_lag`` seconds after it ends.
* A sender's timestamp more than ``MAX_CLOCK_SKEW_NS`` ahead of the sink's clock counts as
  now: one bad clock never moves a window or a bucket into the future.

Pure: the wall clock is injected, nothing here reads time or does I/O.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable

MAX_CLOCK_SKEW_NS = 60 * 10**9
"""How far ahead of the sink's clock a sender's timestamp may be before it is taken as now."""

MAX_WINDOWS = 100_000
"""Windows kept; past it the oldest half is forgotten (data that old joins the oldest kept)."""


class StepWindows:
    """One run's step windows and time buckets."""

    def __init__(
        self, *, time_bucket: float = 1.0, time_bucket_lag: float = 2.0, wall: Callable[[], float] = time.time
    ) -> None:
        self.time_bucket = time_bucket
        self.time_bucket_lag = time_bucket_lag
        self.wall = wall
        self._steps: list[int] = []
        self._ends: list[int] = []
        """Steps whose window end is known, ascending, and those ends (ns, never going back)."""
        self.epoch: int | None = None
        """Time buckets (no process steps): the run's first bucket, in buckets since 1970."""
        self._origin: tuple[int, int] | None = None
        """The run's first window: (its step, its start in ns), when its closer said when it began."""

    @property
    def bucketed(self) -> bool:
        """Whether steps are time buckets (no process of the run steps yet)."""
        return self.epoch is not None

    def close(self, step: int, time_unix_nano: int, start_unix_nano: int = 0) -> None:
        """A process closed ``step`` at ``time_unix_nano``: the first close of a step ends its window
        (the run's first window starts at ``start_unix_nano``, when the step began for that process)."""
        if self._steps and step <= self._steps[-1]:
            return
        end = max(self.clamped(time_unix_nano), self._ends[-1] if self._ends else 0)
        if not self._steps and 0 < start_unix_nano <= end:
            self._origin = (step, start_unix_nano)
        self._steps.append(step)
        self._ends.append(end)
        if len(self._steps) > MAX_WINDOWS:
            del self._steps[: MAX_WINDOWS // 2], self._ends[: MAX_WINDOWS // 2]

    def clear(self) -> None:
        """A restarted run: its steps start again, so do their windows."""
        self._steps.clear()
        self._ends.clear()
        self._origin = None

    def clamped(self, time_unix_nano: int) -> int:
        """A sender's time, or now when it is absent or more than ``MAX_CLOCK_SKEW_NS`` ahead."""
        now = int(self.wall() * 1e9)
        return now if not time_unix_nano or time_unix_nano > now + MAX_CLOCK_SKEW_NS else time_unix_nano

    def step_at(self, time_unix_nano: int, *, stepping: bool, open_step: int | None, last_finalized: int) -> int:
        """The step of data stamped ``time_unix_nano`` (0: now). ``stepping``: some process closes
        steps (``open_step``, the lowest open one, takes data before any window is known)."""
        t = self.clamped(time_unix_nano)
        if self._ends:
            i = bisect.bisect_left(self._ends, t)
            return self._steps[i] if i < len(self._steps) else self._steps[-1] + 1
        if stepping:
            return open_step if open_step is not None else last_finalized + 1
        width = self.time_bucket * 1e9
        if self.epoch is None:  # from the sink's clock, give or take the skew: one old timestamp never
            # makes every later bucket a huge step; a reopened run goes on after its last step
            first = max(t, int(self.wall() * 1e9) - MAX_CLOCK_SKEW_NS)
            self.epoch = int(first / width) - (last_finalized + 1)
        return max(0, int(t / width) - self.epoch)

    def stop_bucketing(self) -> bool:
        """The first process closed a step: buckets give way to steps. True if they were on."""
        was, self.epoch = self.epoch is not None, None
        return was

    def bucket_due(self, step: int, now: float) -> float:
        """When, on the clock that reads ``now``, time bucket ``step`` is final: its end plus the lag."""
        assert self.epoch is not None
        end = (self.epoch + step + 1) * self.time_bucket + self.time_bucket_lag
        return now + (end - self.wall())

    def bucket_start(self, step: int) -> float:
        """Unix seconds at which time bucket ``step`` starts (what its view plots against)."""
        assert self.epoch is not None
        return (self.epoch + step) * self.time_bucket

    def from_start(self, step: int) -> bool:
        """Whether ``step``'s duration counts from its closer's start (the run's first window: its
        set-up is in it)."""
        return self._origin is not None and self._origin[0] == step and bool(self._steps) and self._steps[0] == step

    def duration(self, step: int) -> float | None:
        """Seconds between the end of ``step``'s window and the previous step's, or the run's first
        window's start (None if unknown)."""
        i = bisect.bisect_left(self._steps, step)
        if i >= len(self._steps) or self._steps[i] != step:
            return None
        if i == 0:
            origin = self._origin
            return (self._ends[0] - origin[1]) / 1e9 if origin is not None and origin[0] == step else None
        return (self._ends[i] - self._ends[i - 1]) / 1e9
