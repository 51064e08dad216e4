"""Stragglers: a process named over the thresholds in consecutive judged steps is one streak.

Who is over the thresholds in a step is measured by ``book.stragglers`` (a rank far over the
others in a phase net of its collective waits, or the last to arrive at a collective); this part
turns those steps into streaks: said once, as one record, when a streak has held
``straggler_steps`` steps in a row (one noisy step on a busy box is not a straggler), with its
``first_step``; the status route's copy keeps its ``last_step`` and ``steps`` up to date.
"""

from __future__ import annotations

from typing import Any

from ....core.anomalies import Anomaly, Straggler
from .base import StepFacts, Thresholds
from .streaks import Streaks


class StragglerDetector:
    def __init__(self, thresholds: Thresholds) -> None:
        self.on = thresholds.straggler_ratio > 0
        self.streaks: Streaks[Straggler] = Streaks(thresholds.straggler_steps)
        """By process label."""

    def judge(self, facts: StepFacts) -> list[Anomaly]:
        if not self.on or facts.warm:
            return []
        return list(self.streaks.step(facts.step, ((r.process or "", r) for r, _ in facts.stragglers)))

    def restart(self) -> None:
        self.streaks.restart()

    def live(self) -> list[Anomaly]:
        return list(self.streaks.live())

    def status(self) -> dict[str, Any]:
        return {"straggler_streaks": [r.to_json() for r in self.streaks.live()]}
