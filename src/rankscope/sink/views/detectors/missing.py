"""Missing processes: a step that waited in vain for some of the run's processes."""

from __future__ import annotations

from ....core.anomalies import Anomaly, Missing
from .base import DetectorDefaults, StepFacts, Thresholds

SHOWN = 64
"""Processes a record names at most (its ``count`` says how many)."""


class MissingDetector(DetectorDefaults):
    def __init__(self, thresholds: Thresholds) -> None:
        self.on = thresholds.missing

    def judge(self, facts: StepFacts) -> list[Anomaly]:
        if not self.on or not facts.missing:
            return []
        return [Missing(step=facts.step, processes=tuple(facts.missing[:SHOWN]), count=len(facts.missing))]
