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
[states]]`` for a custom type. ``merge_rows`` takes rows from the edge (``validate.StateRows``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..metrics.reduce import DISTRIBUTION_SCALE, Reduce, Value
from ..otlp.metrics import Row, state_of

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


_MERGES: dict[str, _Merge] = {
    "sum": _adder(1, "sum"),
    "count": _adder(1, "count"),
    "mean": _adder(2, "mean"),
    "std": _adder(3, "std"),
    "max": _extreme(1.0, "max"),
    "min": _extreme(-1.0, "min"),
    "last": _last,
    "distribution": _distribution,
}
