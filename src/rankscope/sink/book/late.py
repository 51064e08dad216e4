"""Late updates: finalized steps that took late data, and when they are written again.

Points for a finalized step are merged into the step's kept running states (``retained``; past
its window, into a partial step of their own) and written again as a late update of that step, at
most once per step per ``late_interval``: a straggler sending point by point must not make the
views rewrite a step per request. A written step goes back to the window (``StepBook.late``).
"""

from __future__ import annotations

from collections.abc import Callable

from .step import Step


class LateSteps:
    """Finalized steps with late data not written yet, and the time of the last late update."""

    def __init__(self, interval: float, now: float) -> None:
        self.interval = interval
        self.pending: dict[int, Step] = {}
        """Step -> what its next late update writes (the retained step, or late data alone)."""
        self.written = now
        """When the last late updates were taken (``take``)."""

    def bucket(self, step: int, kept: Callable[[int, float], Step | None], now: float) -> Step:
        """Where late data of ``step`` merges: its pending update, else the step taken out of the
        window (``kept``: so the update is the whole step's), else a partial step of its own (opened ``now``)."""
        bucket = self.pending.get(step)
        if bucket is None:
            bucket = self.pending[step] = kept(step, now) or Step(step, now, whole=False)
        return bucket

    def take(self, now: float, *, force: bool = False) -> list[Step]:
        """The pending steps in order, when ``late_interval`` has passed since the last (all when ``force``)."""
        if not self.pending or (not force and now - self.written < self.interval):
            return []
        self.written = now
        pending, self.pending = self.pending, {}
        return [bucket for _, bucket in sorted(pending.items())]

    def deadline(self) -> float | None:
        """When the pending late updates are due; None: none pending."""
        return self.written + self.interval if self.pending else None

    def clear(self) -> None:
        """A restarted run: what was pending belongs to steps executed again."""
        self.pending.clear()
