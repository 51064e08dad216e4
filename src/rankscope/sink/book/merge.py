"""Running merges of reduce states: one state per (step, key), whatever the number of processes.

A step of a 1,024-rank job brings a thousand states per key. Keeping them to reduce at the
end costs an object per point and a pass over all of them per view; merging each row into the
key's running state as it arrives costs a few additions, and the view reduces one state. The
merges are exact for every built-in reduce type (the same arithmetic, in arrival order, as
``get_reduced_value_from_states`` over the list): MEAN, STD, SUM and COUNT add; MAX and MIN
keep the extreme and its holder (NaN wins, then the lowest rank); LAST keeps the latest by
time (the first on a tie); DISTRIBUTION adds buckets at the common scale. A custom reduce
type's states are kept as a list: its reducer is third-party code that only merges lists.

A running state is a list: ``[reduce, field, ...]`` in ``otlp.metrics.FIELDS`` order (MAX/MIN:
value, holder rank, holder label), ``[reduce, state]`` for a distribution, ``[reduce,
[states]]`` for a custom type. ``merge_rows`` takes rows from the edge (``checked.StateRows``).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from typing import Any

from ...metrics.reduce import DISTRIBUTION_QUANTILES, DISTRIBUTION_SCALE, Reduce, Value, quantiles
from ...otlp.metrics import MAX_BUCKETS, Row, state_of

Running = list[Any]
_Merge = Callable[[dict[str, Running], list[str], list[Row], int, str], None]


def merge_rows(into: dict[str, Running], reduce: str, keys: list[str], rows: list[Row], rank: int, label: str) -> None:
    """Merge one process's rows (``keys[i]`` holds ``rows[i]``) into ``into``.

    ``rank`` and ``label`` name the sending process: the holder of a MAX/MIN row that does not
    name one (a Collector's merged row names its own). Every key's reduce type must be
    ``reduce`` (the sink's admission makes sure)."""
    merge = _MERGES.get(reduce)
    if merge is None:
        _custom(into, reduce, keys, rows)
    else:
        merge(into, keys, rows, rank, label)


OTEL_GAUGE, OTEL_UPDOWN, OTEL_HISTOGRAM, OTEL_EXPONENTIAL = (
    "otel.gauge",
    "otel.updown",
    "otel.histogram",
    "otel.exponential",
)


def merge_state(into: dict[str, Running], key: str, state: Running) -> None:
    """Merge another running state of ``key`` into ``into`` (as if its rows had come here): what
    two steps took, added up (the end of time buckets, ``book.buckets``)."""
    reduce = state[0]
    if reduce not in _MERGES:  # a custom type's states, kept as a list
        _custom(into, reduce, [key] * len(state[1]), [(one,) for one in state[1]])
    elif reduce in (OTEL_GAUGE, OTEL_UPDOWN):  # per stream: each label's newest
        for label, (time_unix_nano, value) in state[1].items():
            merge_rows(into, reduce, [key], [(value, time_unix_nano)], 0, label)
    elif reduce == OTEL_HISTOGRAM:
        _, by_bounds, count, total, low, high = state
        rows = [(bounds, tuple(counts), 0, 0.0, math.nan, math.nan) for bounds, counts in by_bounds.items()]
        rows.append(((), (), count, total, low, high))  # the totals and extremes once
        merge_rows(into, reduce, [key] * len(rows), rows, 0, "")
    elif reduce in ("distribution", OTEL_EXPONENTIAL):
        merge_rows(into, reduce, [key], [(state[1],)], 0, "")
    else:  # the adders, MAX/MIN (the row names its holder), LAST: the state is the row
        merge_rows(into, reduce, [key], [tuple(state[1:])], 0, "")


def reduce_of(reduce: str) -> Reduce:
    """The reduce type a view reports for a state (a derived type: the reduction it applies)."""
    derived = DERIVED.get(reduce)
    return derived[1] if derived is not None else Reduce.get(reduce)


def items(key: str, state: Running) -> list[tuple[str, float]] | None:
    """A derived type's (name, value) pairs, or None for a reduce type (``reduced`` gives its value)."""
    derived = DERIVED.get(state[0])
    return None if derived is None else derived[0](key, state)


def reduced(reduce: str, state: Running) -> Value:
    """The reduced value of a running state (may raise for a third-party reduce type)."""
    accumulator = Reduce.get(reduce).accumulator_class
    if reduce in _MERGES:
        return accumulator.get_reduced_value_from_states([state_of(reduce, tuple(state[1:]))])
    return accumulator.get_reduced_value_from_states(state[1])


def holder(state: Running) -> tuple[int, str]:
    """(rank, label) of the process holding a MAX/MIN running state's extreme."""
    return state[2], state[3]


def _adder(width: int, reduce: str) -> _Merge:
    if width == 1:

        def add1(into: dict[str, Running], keys: list[str], rows: list[Row], rank: int, label: str) -> None:
            for key, (value,) in zip(keys, rows, strict=True):
                state = into.get(key)
                if state is None:
                    into[key] = [reduce, value]
                else:
                    state[1] += value

        return add1
    if width == 2:

        def add2(into: dict[str, Running], keys: list[str], rows: list[Row], rank: int, label: str) -> None:
            for key, (count, total) in zip(keys, rows, strict=True):
                state = into.get(key)
                if state is None:
                    into[key] = [reduce, count, total]
                else:
                    state[1] += count
                    state[2] += total

        return add2

    def add3(into: dict[str, Running], keys: list[str], rows: list[Row], rank: int, label: str) -> None:
        for key, (count, total, squares) in zip(keys, rows, strict=True):
            state = into.get(key)
            if state is None:
                into[key] = [reduce, count, total, squares]
            else:
                state[1] += count
                state[2] += total
                state[3] += squares

    return add3


def _extreme(sign: float, reduce: str) -> _Merge:
    def merge(into: dict[str, Running], keys: list[str], rows: list[Row], rank: int, label: str) -> None:
        for key, (value, held_by, held_label) in zip(keys, rows, strict=True):
            if held_by is None:
                held_by, held_label = rank, label
            elif held_label is None:
                held_label = f"rank {held_by}"
            state = into.get(key)
            if state is None:
                into[key] = [reduce, value, held_by, held_label]
                continue
            current = state[1]
            if current != current:  # NaN is sticky; among NaNs the lowest rank
                better = value != value and held_by < state[2]
            elif value != value:
                better = True
            else:
                better = sign * value > sign * current or (value == current and held_by < state[2])
            if better:
                state[1], state[2], state[3] = value, held_by, held_label

    return merge


def _last(into: dict[str, Running], keys: list[str], rows: list[Row], rank: int, label: str) -> None:
    for key, (value, time_unix_nano) in zip(keys, rows, strict=True):
        state = into.get(key)
        if state is None:
            into[key] = ["last", value, time_unix_nano]
        elif time_unix_nano > state[2]:
            state[1], state[2] = value, time_unix_nano


def _distribution(into: dict[str, Running], keys: list[str], rows: list[Row], rank: int, label: str) -> None:
    for key, (incoming,) in zip(keys, rows, strict=True):
        state = into.get(key)
        if state is None:
            empty = {"scale": DISTRIBUTION_SCALE, "count": 0, "sum": 0.0, "zero_count": 0}
            state = into[key] = ["distribution", {**incoming, **empty, "positive": {}, "negative": {}}]
        _add_distribution(state[1], incoming)


def _add_distribution(into: dict[str, Any], state: dict[str, Any]) -> None:
    """Add ``state`` to ``into`` (at ``DISTRIBUTION_SCALE``), as ``get_reduced_value_from_states`` would."""
    shift = state["scale"] - DISTRIBUTION_SCALE  # the edge admits scales >= DISTRIBUTION_SCALE only
    into["count"] += state["count"]
    into["sum"] += state["sum"]
    into["zero_count"] += state["zero_count"]
    lo, hi = state["min"], state["max"]
    if lo != lo or into["min"] != into["min"]:
        into["min"] = into["max"] = float("nan")
    else:
        into["min"], into["max"] = min(into["min"], lo), max(into["max"], hi)
    for mine, theirs in ((into["positive"], state["positive"]), (into["negative"], state["negative"])):
        for index, n in theirs.items():
            index = int(index) >> shift
            mine[index] = mine.get(index, 0) + n


def _custom(into: dict[str, Running], reduce: str, keys: list[str], rows: list[Row]) -> None:
    for key, (state,) in zip(keys, rows, strict=True):
        running = into.get(key)
        if running is None:
            into[key] = [reduce, [state]]
        else:
            running[1].append(state)


def _latest(reduce: str) -> _Merge:
    """LAST per stream: a process's newest value of the key (the first on a tie)."""

    def merge(into: dict[str, Running], keys: list[str], rows: list[Row], rank: int, label: str) -> None:
        for key, (value, time_unix_nano) in zip(keys, rows, strict=True):
            state = into.get(key)
            if state is None:
                into[key] = [reduce, {label: (time_unix_nano, value)}]
                continue
            held = state[1].get(label)
            if held is None or time_unix_nano > held[0]:
                state[1][label] = (time_unix_nano, value)

    return merge


def _gauge_items(key: str, state: Running) -> list[tuple[str, float]]:
    values = [value for _, value in state[1].values()]
    if any(v != v for v in values):
        nan = math.nan
        return [(key, nan), (f"{key}/min", nan), (f"{key}/max", nan)]
    return [(key, _total(values) / len(values)), (f"{key}/min", min(values)), (f"{key}/max", max(values))]


def _updown_items(key: str, state: Running) -> list[tuple[str, float]]:
    return [(key, _total([value for _, value in state[1].values()]))]


def _total(values: list[float]) -> float:
    """An exact sum, or the plain one where the exact one cannot be had (inf, overflow)."""
    try:
        return math.fsum(values)
    except (ValueError, OverflowError):
        return float(sum(values))


MAX_BOUND_SETS = 16
"""Distinct sets of histogram bounds one key keeps per step; more are re-bucketed into the first."""


def _histograms(into: dict[str, Running], keys: list[str], rows: list[Row], rank: int, label: str) -> None:
    for key, (bounds, counts, count, total, low, high) in zip(keys, rows, strict=True):
        state = into.get(key)
        if state is None:
            state = into[key] = [OTEL_HISTOGRAM, {}, 0, 0.0, math.nan, math.nan]
        if counts:
            sets = state[1]
            mine = sets.get(bounds)
            if mine is None and len(sets) >= MAX_BOUND_SETS:  # bounded: fold into the first set's buckets
                bounds, counts = _rebucketed(next(iter(sets)), bounds, counts)
                mine = sets[bounds]
            if mine is None:
                sets[bounds] = list(counts)
            else:
                for i, n in enumerate(counts):
                    mine[i] += n
        state[2] += count
        state[3] += total
        state[4] = low if state[4] != state[4] else min(state[4], low) if low == low else state[4]
        state[5] = high if state[5] != state[5] else max(state[5], high) if high == high else state[5]


def _rebucketed(target: tuple[float, ...], bounds: tuple[float, ...], counts: Row) -> tuple[tuple[float, ...], Row]:
    """``counts`` over ``bounds`` moved into ``target``'s buckets, each by its upper bound (approximate)."""
    moved = [0] * (len(target) + 1)
    for i, n in enumerate(counts):
        upper = bounds[i] if i < len(bounds) else math.inf
        moved[bisect.bisect_left(target, upper)] += n
    return target, tuple(moved)


def _histogram_items(key: str, state: Running) -> list[tuple[str, float]]:
    _, by_bounds, count, total, low, high = state
    out = [(f"{key}/count", float(count)), (f"{key}/sum", total), (f"{key}/mean", total / count if count else math.nan)]
    segments: list[tuple[float, float, int]] = []
    for bounds, counts in by_bounds.items():
        edges = [_edge(low, bounds[0] if bounds else math.nan, low_side=True), *bounds]
        edges.append(_edge(high, bounds[-1] if bounds else math.nan, low_side=False))
        segments.extend((edges[i], edges[i + 1], n) for i, n in enumerate(counts) if n > 0)
    found = _quantiles(segments, [q for _, q in DISTRIBUTION_QUANTILES])
    out.extend((f"{key}/{name}", value) for (name, _), value in zip(DISTRIBUTION_QUANTILES, found, strict=True))
    return out


def _edge(extreme: float, bound: float, *, low_side: bool) -> float:
    """The finite end of an open-ended bucket: the exact extreme where known and beyond the bound."""
    if extreme == extreme and math.isfinite(extreme) and (bound != bound or (extreme < bound) == low_side):
        return extreme
    return bound


def _quantiles(segments: list[tuple[float, float, int]], qs: list[float]) -> list[float]:
    """The quantiles ``qs`` (ascending) of buckets taken as uniform between their edges, linear
    interpolation as Prometheus' ``histogram_quantile`` does, across buckets of different bounds
    alike; a bucket of no width (an open end without a known extreme) is all at its bound.
    One sorted sweep over the edges: O(S log S) for S buckets."""
    slopes: dict[float, float] = {}
    masses: dict[float, float] = {}
    total = 0
    for lo, hi, n in segments:
        if not (lo == lo and hi == hi) or math.isinf(lo) or math.isinf(hi):
            continue
        total += n
        if hi > lo:
            slopes[lo] = slopes.get(lo, 0.0) + n / (hi - lo)
            slopes[hi] = slopes.get(hi, 0.0) - n / (hi - lo)
        else:
            masses[lo] = masses.get(lo, 0.0) + n
    if not total:
        return [math.nan] * len(qs)
    out: list[float] = []
    targets = iter(q * total for q in qs)
    target: float | None = next(targets)
    below, slope, previous = 0.0, 0.0, None
    for x in sorted(slopes.keys() | masses.keys()):
        if previous is not None:
            reached = below + slope * (x - previous)
            while target is not None and target <= reached:
                out.append(previous + (x - previous) * (target - below) / (reached - below) if reached > below else x)
                target = next(targets, None)
            below = reached
        below += masses.get(x, 0.0)
        while target is not None and target <= below:
            out.append(x)
            target = next(targets, None)
        slope += slopes.get(x, 0.0)
        previous = x
        if target is None:
            break
    while len(out) < len(qs):
        out.append(previous if previous is not None else math.nan)
    return out


def _exponentials(into: dict[str, Running], keys: list[str], rows: list[Row], rank: int, label: str) -> None:
    """Exponential histograms at the common scale: the coarsest seen (finer buckets fold exactly)."""
    for key, (incoming,) in zip(keys, rows, strict=True):
        state = into.get(key)
        if state is None:
            empty = {"count": 0, "sum": 0.0, "zero_count": 0, "min": math.nan, "max": math.nan}
            state = into[key] = [
                OTEL_EXPONENTIAL,
                {**empty, "scale": incoming["scale"], "positive": {}, "negative": {}},
            ]
        running = state[1]
        if incoming["scale"] < running["scale"]:
            shift = running["scale"] - incoming["scale"]
            for side in ("positive", "negative"):
                folded: dict[int, int] = {}
                for index, n in running[side].items():
                    folded[index >> shift] = folded.get(index >> shift, 0) + n
                running[side] = folded
            running["scale"] = incoming["scale"]
        shift = incoming["scale"] - running["scale"]
        running["count"] += incoming["count"]
        running["sum"] += incoming["sum"]
        running["zero_count"] += incoming["zero_count"]
        for extreme, pick in (("min", min), ("max", max)):
            theirs, mine = incoming[extreme], running[extreme]
            running[extreme] = theirs if mine != mine else pick(mine, theirs) if theirs == theirs else mine
        for side in ("positive", "negative"):
            mine = running[side]
            for index, n in incoming[side].items():
                index = int(index) >> shift
                mine[index] = mine.get(index, 0) + n
        while len(running["positive"]) + len(running["negative"]) > MAX_BUCKETS and running["scale"] > -10:
            running["scale"] -= 1  # bounded: one scale coarser halves the buckets (exactly, as OTel SDKs do)
            for side in ("positive", "negative"):
                coarser: dict[int, int] = {}
                for index, n in running[side].items():
                    coarser[index >> 1] = coarser.get(index >> 1, 0) + n
                running[side] = coarser


def _exponential_items(key: str, state: Running) -> list[tuple[str, float]]:
    s = state[1]
    count, total = s["count"], s["sum"]
    out = [(f"{key}/count", float(count)), (f"{key}/sum", total), (f"{key}/mean", total / count if count else math.nan)]
    found = quantiles(s["positive"], s["negative"], s["zero_count"], s["scale"], s["min"], s["max"])
    out.extend((f"{key}/{name}", value) for name, value in found.items())
    return out


DERIVED: dict[str, tuple[Callable[[str, Running], list[tuple[str, float]]], Reduce]] = {
    OTEL_GAUGE: (_gauge_items, Reduce.MEAN),
    OTEL_UPDOWN: (_updown_items, Reduce.SUM),
    OTEL_HISTOGRAM: (_histogram_items, Reduce.get("distribution")),
    OTEL_EXPONENTIAL: (_exponential_items, Reduce.get("distribution")),
}
"""Derived type -> (its view's (name, value) pairs, the reduce type the views report)."""

_MERGES: dict[str, _Merge] = {
    "sum": _adder(1, "sum"),
    "count": _adder(1, "count"),
    "mean": _adder(2, "mean"),
    "std": _adder(3, "std"),
    "max": _extreme(1.0, "max"),
    "min": _extreme(-1.0, "min"),
    "last": _last,
    "distribution": _distribution,
    OTEL_GAUGE: _latest(OTEL_GAUGE),
    OTEL_UPDOWN: _latest(OTEL_UPDOWN),
    OTEL_HISTOGRAM: _histograms,
    OTEL_EXPONENTIAL: _exponentials,
}
