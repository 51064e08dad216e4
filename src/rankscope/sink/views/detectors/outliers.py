"""Outliers: a process whose value of a key stays far from the others' is one streak.

Which process is far from the others in a step is measured by ``book.outliers`` (from the
processes' spread of each key, ``book.spread``); this part turns those steps into streaks per
(process, key): said once, as one record, when a streak has held ``outlier_steps`` judged steps
in a row (a noisy step is not an outlier), with its ``first_step``; the status route's copy keeps
its ``last_step`` and ``steps`` up to date.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Any

from ....core.anomalies import Anomaly, Outlier
from .base import StepFacts, Thresholds

MAX_STREAKS_SHOWN = 64
"""Outlier streaks the status route lists (the latest), each with its extent so far."""


class OutlierDetector:
    def __init__(self, thresholds: Thresholds) -> None:
        self.on = thresholds.outlier_sigmas > 0
        self.needed = max(1, thresholds.outlier_steps)
        self.streaks: dict[tuple[str, str], Outlier] = {}
        """Open streaks by (process label, key), as they are now (named or not yet)."""
        self.named: OrderedDict[tuple[str | None, str, int], Outlier] = OrderedDict()
        """The run's latest streaks named, as they are now (the status route, the report)."""

    def judge(self, facts: StepFacts) -> list[Anomaly]:
        if not self.on or facts.warm:
            return []
        said: list[Anomaly] = []
        now: dict[tuple[str, str], Outlier] = {}
        for record, _process in facts.outliers:
            which = (record.process or "", record.key)
            held = self.streaks.get(which)
            first, steps = (facts.step, 1) if held is None else (held.first_step, held.steps + 1)
            live = dataclasses.replace(record, step=first, first_step=first, last_step=facts.step, steps=steps)
            now[which] = live
            if steps == self.needed:
                said.append(live)
            if steps >= self.needed:
                self.named[(live.process, live.key, first)] = live
                while len(self.named) > MAX_STREAKS_SHOWN:
                    self.named.popitem(last=False)
        self.streaks = now
        return said

    def restart(self) -> None:
        self.streaks = {}

    def live(self) -> list[Anomaly]:
        return list(self.named.values())

    def status(self) -> dict[str, Any]:
        return {"outlier_streaks": [r.to_json() for r in self.named.values()]}
