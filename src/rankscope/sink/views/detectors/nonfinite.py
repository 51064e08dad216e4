"""Non-finite values: a step whose merged value of a key is NaN or infinite, and who recorded it."""

from __future__ import annotations

from typing import Any

from ....core.anomalies import Anomaly, NonFinite
from .base import StepFacts, Thresholds


class NonFiniteDetector:
    """Names the first process state of the step that is not finite; remembers the run's first."""

    def __init__(self, thresholds: Thresholds) -> None:
        self.on = thresholds.nonfinite
        self.first: NonFinite | None = None
        """The run's first non-finite value (the status route's ``first_nonfinite``)."""

    def judge(self, facts: StepFacts) -> list[Anomaly]:
        if not self.on or not facts.nonfinite:
            return []
        key, process = facts.nonfinite[0]
        who: dict[str, Any] = {}
        if process is not None:
            who = {"process": process.label, "role": process.role, "replica": process.replica, "rank": process.rank}
        keys = tuple(sorted({k for k, _ in facts.nonfinite})[:16])
        record = NonFinite(
            step=facts.step, key=key, count=len(facts.nonfinite), keys=keys, first=self.first is None, **who
        )
        if self.first is None:
            self.first = record
        return [record]

    def restart(self) -> None:
        return None  # the run's first non-finite value stays its first

    def live(self) -> tuple[()]:
        return ()

    def status(self) -> dict[str, Any]:
        first = self.first
        if first is None:
            return {"first_nonfinite": None}
        fields = ("step", "key", "process") + (("role", "replica", "rank") if first.process is not None else ("rank",))
        return {"first_nonfinite": {f: getattr(first, f) for f in fields}}
