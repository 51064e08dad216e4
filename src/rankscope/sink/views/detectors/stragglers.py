"""Stragglers: a process named over the thresholds in consecutive judged steps is one streak.

Who is over the thresholds in a step is measured by ``book.stragglers`` (a rank far over the
others in a phase net of its collective waits, or the last to arrive at a collective); this part
turns those steps into streaks: said once, as one record, when a streak has held
``straggler_steps`` steps in a row (one noisy step on a busy box is not a straggler), with its
``first_step``; the status route's copy keeps its ``last_step`` and ``steps`` up to date.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Any

from ....core.anomalies import Anomaly, Straggler
from .base import StepFacts, Thresholds

MAX_STREAKS_SHOWN = 64
"""Straggler streaks the status route lists (the latest), each with its extent so far."""


class StragglerDetector:
    def __init__(self, thresholds: Thresholds) -> None:
        self.on = thresholds.straggler_ratio > 0
        self.needed = max(1, thresholds.straggler_steps)
        self.streaks: dict[str, Straggler] = {}
        """Open streaks by process label, as they are now (named or not yet)."""
        self.named: OrderedDict[tuple[str | None, int], Straggler] = OrderedDict()
        """The run's latest streaks named, as they are now (the status route, the report)."""

    def judge(self, facts: StepFacts) -> list[Anomaly]:
        if not self.on or facts.warm:
            return []
        said: list[Anomaly] = []
        now: dict[str, Straggler] = {}
        for record, _process in facts.stragglers:
            label = record.process or ""
            held = self.streaks.get(label)
            first, steps = (facts.step, 1) if held is None else (held.first_step, held.steps + 1)
            live = dataclasses.replace(record, step=first, first_step=first, last_step=facts.step, steps=steps)
            now[label] = live
            if steps == self.needed:
                said.append(live)
            if steps >= self.needed:  # in the order they were named; the latest figures in place
                self.named[(live.process, first)] = live
                while len(self.named) > MAX_STREAKS_SHOWN:
                    self.named.popitem(last=False)
        self.streaks = now
        return said

    def restart(self) -> None:
        self.streaks = {}  # a streak does not carry over a restart

    def live(self) -> list[Anomaly]:
        return list(self.named.values())

    def status(self) -> dict[str, Any]:
        return {"straggler_streaks": [r.to_json() for r in self.named.values()]}
