"""Outliers: a process whose value of a key stays far from the others' is one streak.

Which process is far from the others in a step is measured by ``book.outliers`` (from the
processes' spread of each key, ``book.spread``); this part turns those steps into streaks per
(process, key): said once, as one record, when a streak has held ``outlier_steps`` judged steps
in a row (a noisy step is not an outlier), with its ``first_step``; the status route's copy keeps
its ``last_step`` and ``steps`` up to date.
"""

from __future__ import annotations

from typing import Any

from ....core.anomalies import Anomaly, Outlier
from .base import StepFacts, Thresholds
from .streaks import Streaks


class OutlierDetector:
    def __init__(self, thresholds: Thresholds) -> None:
        self.on = thresholds.outlier_sigmas > 0
        self.streaks: Streaks[Outlier] = Streaks(thresholds.outlier_steps)
        """By (process label, key)."""

    def judge(self, facts: StepFacts) -> list[Anomaly]:
        if not self.on or facts.warm:
            return []
        return list(self.streaks.step(facts.step, (((r.process or "", r.key), r) for r, _ in facts.outliers)))

    def restart(self) -> None:
        self.streaks.restart()

    def live(self) -> list[Anomaly]:
        return list(self.streaks.live())

    def status(self) -> dict[str, Any]:
        return {"outlier_streaks": [r.to_json() for r in self.streaks.live()]}
