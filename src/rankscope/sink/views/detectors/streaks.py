"""Streaks: the same thing named in consecutive judged steps is said once, as one record.

What the straggler and outlier detectors share: a candidate of a step (by its own key: a process,
or a process and a key) either continues the streak it held at the step before or starts one.
A streak is said once, as one record, when it has held ``needed`` steps in a row, with its
``first_step``; the run's latest named streaks are kept with their ``last_step`` and ``steps``
up to date (the status route, the report).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from typing import Any, Generic, TypeVar

MAX_SHOWN = 64
"""Streaks a detector lists in the status route (the latest), each with its extent so far."""

R = TypeVar("R", bound=Any)
"""A record with ``step``, ``first_step``, ``last_step`` and ``steps`` (``core.anomalies``)."""


class Streaks(Generic[R]):
    def __init__(self, needed: int) -> None:
        self.needed = max(1, needed)
        self.open: dict[Hashable, R] = {}
        """Streaks held at the last judged step, as they are now (named or not yet)."""
        self.named: OrderedDict[Hashable, R] = OrderedDict()
        """The run's latest streaks named, as they are now."""

    def step(self, step: int, found: Iterable[tuple[Hashable, R]]) -> list[R]:
        """This judged step's candidates (each its streak's key and record); returns the records
        of the streaks that reached ``needed`` steps now (to be said)."""
        said: list[R] = []
        now: dict[Hashable, R] = {}
        for which, record in found:
            held = self.open.get(which)
            first, steps = (step, 1) if held is None else (held.first_step, held.steps + 1)
            live = dataclasses.replace(record, step=first, first_step=first, last_step=step, steps=steps)
            now[which] = live
            if steps == self.needed:
                said.append(live)
            if steps >= self.needed:  # in the order they were named; the latest figures in place
                self.named[(which, first)] = live
                while len(self.named) > MAX_SHOWN:
                    self.named.popitem(last=False)
        self.open = now
        return said

    def restart(self) -> None:
        self.open = {}  # a streak does not carry over a restart

    def live(self) -> list[R]:
        return list(self.named.values())
