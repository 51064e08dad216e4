"""Slow steps: a step's wall-clock window against the rolling median of the last ones."""

from __future__ import annotations

import statistics
from collections import deque

from ....core.anomalies import Anomaly, SlowStep
from .base import DetectorDefaults, StepFacts, Thresholds


class SlowStepDetector(DetectorDefaults):
    """A step ``slow_step_factor`` times the median of the last ``slow_step_history`` steps and at
    least ``slow_step_min_s`` over it; the history is of judged steps past the warm-up."""

    def __init__(self, thresholds: Thresholds) -> None:
        self.factor, self.min_s = thresholds.slow_step_factor, thresholds.slow_step_min_s
        self.durations: deque[float] = deque(maxlen=max(1, thresholds.slow_step_history))

    def judge(self, facts: StepFacts) -> list[Anomaly]:
        duration = facts.duration
        if self.factor <= 0 or duration is None or duration <= 0 or facts.warm:
            return []
        found: list[Anomaly] = []
        if len(self.durations) == self.durations.maxlen:
            median = statistics.median(self.durations)
            if median > 0 and duration >= self.factor * median and duration - median >= self.min_s:
                found.append(
                    SlowStep(step=facts.step, seconds=duration, median_s=median, factor=round(duration / median, 3))
                )
        self.durations.append(duration)
        return found
