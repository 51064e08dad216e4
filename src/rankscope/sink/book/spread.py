"""How far a key's extreme process is from the others, per step: the measure behind outliers.

Per role and key of a MEAN, SUM or STD reduce: each process's own value of the step (its mean,
its sum, its standard deviation) folded into a ``Spread``: the count, mean and sum of squared
deviations (``m2``: Welford's update, Chan's merge for a spread merged upstream: exact up to
float rounding, without the cancellation a sum of squares suffers for values like 2.31 ± 1e-4),
and the lowest and highest value with the process that holds it (the lowest rank on a tie, as
MAX and MIN do). Taking the extreme back out of the moments gives the others' mean and spread
in O(1) per key, whatever the number of processes (``Spread.others``).

What a process sent on its own counts as its value (``Finished.parts``); a Collector's merged
rows carry their processes' spread (``StateRows.spreads``, the Go merge processor's), merged in;
a merged row without one (an older Collector) leaves the key's spread unknown for the step. A
NaN or infinite value is the non-finite detector's, not a spread's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...metrics.reduce import Reduce
from ...otlp.metrics import Row
from ..checked import Process, StateRows

JUDGED = frozenset({Reduce.MEAN.value, Reduce.SUM.value, Reduce.STD.value})
"""Reduce types whose processes' values have a spread (MAX and MIN name their holder already)."""


@dataclass(slots=True)
class Spread:
    """The processes' values of one key in one step: moments and both extremes with their holders."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0
    low: float = math.inf
    low_by: Process | None = None
    high: float = -math.inf
    high_by: Process | None = None
    values: Any = None
    """The processes' values (a numpy array, in ``processes``' order) when none came merged:
    a candidate's figures are computed again from them (``exactly``)."""
    processes: list[Process] | None = None

    def add(self, value: float, process: Process) -> None:
        """One process's value (Welford's update)."""
        self.n += 1
        delta = value - self.mean
        self.mean += delta / self.n
        self.m2 += delta * (value - self.mean)
        if value < self.low or (value == self.low and self.low_by is not None and process.rank < self.low_by.rank):
            self.low, self.low_by = value, process
        if value > self.high or (value == self.high and self.high_by is not None and process.rank < self.high_by.rank):
            self.high, self.high_by = value, process

    def merge(self, carried: tuple[Any, ...], role: str) -> None:
        """A spread merged upstream (``otlp.metrics.read_spread``; Chan's parallel update), its
        holders named by their rank and label."""
        n = carried[0]
        if n == 0:
            return
        _, mean, m2, low, low_rank, low_label, high, high_rank, high_label = carried
        total = self.n + n
        delta = mean - self.mean
        self.mean += delta * n / total
        self.m2 += m2 + delta * delta * self.n * n / total
        self.n = total
        if low < self.low or (low == self.low and self.low_by is not None and low_rank < self.low_by.rank):
            self.low, self.low_by = low, _holder(low_rank, low_label, role)
        if high > self.high or (high == self.high and self.high_by is not None and high_rank < self.high_by.rank):
            self.high, self.high_by = high, _holder(high_rank, high_label, role)

    def others(self, high: bool) -> Extreme | None:
        """The highest (``high``) or lowest process against the others' mean and standard
        deviation (the extreme taken back out of the moments); None with fewer than 3 processes
        (one other has no spread, and which of two is off cannot be told)."""
        value, process = (self.high, self.high_by) if high else (self.low, self.low_by)
        if self.n < 3 or process is None:
            return None
        rest = self.n - 1
        mean = (self.n * self.mean - value) / rest
        m2 = max(0.0, self.m2 - (value - self.mean) * (value - mean))
        return Extreme(process, value, mean, math.sqrt(m2 / (rest - 1)), rest)

    def exactly(self, extreme: Extreme) -> Extreme:
        """``extreme`` with the others' mean and standard deviation computed from their values
        (two passes: exact where taking one value back out of the moments loses digits); as it
        is when the values are not kept (a spread merged upstream)."""
        if self.values is None or self.processes is None:
            return extreme
        at = next((i for i, p in enumerate(self.processes) if p is extreme.process), None)
        if at is None:
            return extreme
        rest = np.delete(self.values, at)
        mean = float(rest.mean())
        std = float(rest.std(ddof=1)) if len(rest) > 1 else 0.0
        return Extreme(extreme.process, extreme.value, mean, std, len(rest))


@dataclass(frozen=True, slots=True)
class Extreme:
    """One key's extreme process of a step against the others (``Spread.others``)."""

    process: Process
    value: float
    others_mean: float
    others_std: float
    others: int

    @property
    def deviation(self) -> float:
        return self.value - self.others_mean


def _holder(rank: int, label: str, role: str) -> Process:
    """The process a Collector named as holding an extreme (its rank and label; its role is the
    label's, ``trainer`` of ``trainer_r13``)."""
    named = label or f"{role}_r{rank}"
    holder = Process(named, named, named.rsplit("_r", 1)[0] if "_r" in named else role, None, rank, 0, 0, "", 0, {})
    holder.merged = True  # known by its label only: no capture can be asked of it (``ask_outliers``)
    return holder


def value_of(reduce: str, row: tuple[Any, ...]) -> float | None:
    """A process's own value of a row (``otlp.metrics.FIELDS`` order): its mean, sum or standard
    deviation; None when it has none (no samples) or it is not finite."""
    if reduce == "sum":
        value = float(row[0])
    elif reduce == "mean":
        count, total = row[0], row[1]
        if not count:
            return None
        value = total / count
    elif reduce == "std":
        count, total, squares = row[0], row[1], row[2]
        if not count:
            return None
        mean = total / count
        value = math.sqrt(max(0.0, squares / count - mean * mean))
    else:
        return None
    return value if math.isfinite(value) else None


def spreads(
    parts: Iterable[tuple[Process, StateRows]], judged: Callable[[str, str], bool]
) -> dict[tuple[str, str], Spread]:
    """Per (role, key) of a judged reduce type, the spread of its processes' values; ``judged(key,
    reduce)`` says which keys count (asked once per key). One pass over the step's rows gathers
    each key's values (a list append per row), then numpy folds each key's at once."""
    gather = _Gather(judged)
    for process, rows in parts:
        if rows.reduce in JUDGED:
            (gather.merged if process.merged else gather.own)(process, rows)
    return gather.spreads()


class _Gather:
    """The step's values of each judged key, by role: its processes' own, and spreads carried."""

    def __init__(self, judged: Callable[[str, str], bool]) -> None:
        self.judged = judged
        self.asked: dict[str, bool] = {}
        self.values: dict[str, dict[str, tuple[list[float], list[Process]]]] = {}
        self.carried: dict[tuple[str, str], list[Row]] = {}
        self.unknown: set[tuple[str, str]] = set()

    def counts(self, key: str, reduce: str) -> bool:
        found = self.asked.get(key)
        if found is None:
            found = self.asked[key] = self.judged(key, reduce)
        return found

    def own(self, process: Process, rows: StateRows) -> None:
        """A process's rows: each its own value (its mean, sum or standard deviation), if finite."""
        reduce, by_key, isfinite, asked = (
            rows.reduce,
            self.values.setdefault(process.role, {}),
            math.isfinite,
            self.asked,
        )
        for key, row in zip(rows.keys, rows.rows, strict=True):
            if not (asked.get(key) or (key not in asked and self.counts(key, reduce))):
                continue
            if reduce == "mean":
                value = row[1] / row[0] if row[0] else math.nan
            else:
                found = value_of(reduce, row)
                value = math.nan if found is None else found
            if not isfinite(value):
                continue
            entry = by_key.get(key)
            if entry is None:
                entry = by_key[key] = ([], [])
            entry[0].append(value)
            entry[1].append(process)

    def merged(self, process: Process, rows: StateRows) -> None:
        """A Collector's merged rows: the spreads they carried; one without leaves its key unknown."""
        carried = rows.spreads or {}
        for i, key in enumerate(rows.keys):
            if not self.counts(key, rows.reduce):
                continue
            found = carried.get(i)
            if found is None:
                self.unknown.add((process.role, key))
            else:
                self.carried.setdefault((process.role, key), []).append(found)

    def spreads(self) -> dict[tuple[str, str], Spread]:
        out: dict[tuple[str, str], Spread] = {}
        for role, by_key in self.values.items():
            for key, (values, processes) in by_key.items():
                folded = _folded(values, processes)
                if folded is None:
                    self.unknown.add((role, key))
                else:
                    out[(role, key)] = folded
        for which, rows in self.carried.items():
            spread = out.setdefault(which, Spread())
            spread.values = spread.processes = None  # merged parts' values are not here
            for row in rows:
                spread.merge(row, which[0])
            if not (math.isfinite(spread.mean) and math.isfinite(spread.m2)):
                self.unknown.add(which)
        for which in self.unknown:  # a part of it is not known: no spread rather than a wrong one
            out.pop(which, None)
        return out


def _folded(values: list[float], processes: list[Process]) -> Spread | None:
    """One key's processes' values as a spread (numpy: pairwise sums), the lowest rank on a tie."""
    array = np.fromiter(values, float, len(values))
    with np.errstate(all="ignore"):  # values near the float max overflow: the spread is not known
        mean = float(array.mean())
        m2 = float(np.square(array - mean).sum())
    if not (math.isfinite(mean) and math.isfinite(m2)):
        return None
    low, high = float(array.min()), float(array.max())
    found = Spread(len(values), mean, m2, low, _lowest(array, low, processes), high, _lowest(array, high, processes))
    found.values, found.processes = array, processes
    return found


def _lowest(array: np.ndarray, value: float, processes: list[Process]) -> Process:
    """Of the processes holding ``value``, the lowest rank."""
    return min((processes[int(i)] for i in np.flatnonzero(array == value)), key=lambda p: p.rank)
