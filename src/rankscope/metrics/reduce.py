"""Reduce types as mergeable states.

Every reduce type keeps a small state per key per step (sum and count for MEAN, sum,
sum of squares and count for STD, log-scale buckets for DISTRIBUTION, ...). A process
exports states, not reduced values, so a sink can merge any number of processes exactly
and in any order: ``get_reduced_value_from_states`` is the cross-process reduction.

The accumulator interface is Forge's ``MetricAccumulator`` (append / get_value /
get_state / get_reduced_value_from_states / reset), so Forge reduce types plug in.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import Any, ClassVar

Value = float | dict[str, float]
"""A reduced value: one number, or named numbers (DISTRIBUTION gives p50/p90/p99/mean)."""

_NAN = float("nan")


class Reduce:
    """A reduce type: a name plus the accumulator class that keeps its state.

    Built-ins are attributes (``Reduce.MEAN`` ...). ``Reduce.register`` adds your own;
    a sink finds third-party ones through the ``rankscope.reducers`` entry point group.
    """

    __slots__ = ("accumulator_class", "value")

    MEAN: ClassVar[Reduce]
    SUM: ClassVar[Reduce]
    MAX: ClassVar[Reduce]
    MIN: ClassVar[Reduce]
    STD: ClassVar[Reduce]
    COUNT: ClassVar[Reduce]
    LAST: ClassVar[Reduce]
    DISTRIBUTION: ClassVar[Reduce]
    SAMPLE: ClassVar[Reduce]

    _registry: ClassVar[dict[str, Reduce]] = {}
    _plugins: ClassVar[dict[str, Any] | None] = None

    def __init__(self, value: str, accumulator_class: type[MetricAccumulator]) -> None:
        self.value = value
        self.accumulator_class = accumulator_class

    @property
    def name(self) -> str:
        return self.value.upper()

    def __repr__(self) -> str:
        return f"Reduce.{self.name}"

    def __reduce__(self) -> tuple[Any, tuple[str]]:  # pickles by name across processes/actors
        return (Reduce.get, (self.value,))

    @classmethod
    def register(cls, name: str, accumulator_class: type[MetricAccumulator]) -> Reduce:
        """Register a custom reduce type; returns it (also reachable as ``Reduce.NAME``)."""
        if not name or not name.replace("_", "").isalnum() or not name[0].isalpha():
            raise ValueError(f"reduce type name {name!r} must be a letter followed by [a-zA-Z0-9_]")
        if not (isinstance(accumulator_class, type) and issubclass(accumulator_class, MetricAccumulator)):
            raise TypeError(f"reduce type {name!r}: {accumulator_class!r} is not a MetricAccumulator subclass")
        key = name.lower()
        existing = cls._registry.get(key)
        if existing is not None:
            if existing.accumulator_class is accumulator_class:
                return existing
            raise ValueError(f"reduce type {name!r} is already registered with {existing.accumulator_class!r}")
        reduce = cls(key, accumulator_class)
        cls._registry[key] = reduce
        setattr(cls, key.upper(), reduce)
        return reduce

    @classmethod
    def get(cls, name: str) -> Reduce:
        """Look a reduce type up by name, loading ``rankscope.reducers`` entry points if needed."""
        key = name.lower()
        found = cls._registry.get(key)
        if found is None:
            if cls._plugins is None:  # read once: a sink looks up every unknown name a client sends
                cls._plugins = {ep.name.lower(): ep for ep in entry_points(group="rankscope.reducers")}
            ep = cls._plugins.get(key)
            if ep is not None:
                found = cls.register(ep.name, ep.load())
        if found is None:
            raise KeyError(f"unknown reduce type {name!r}; known: {sorted(cls._registry)}")
        return found

    @classmethod
    def all(cls) -> list[Reduce]:
        return list(cls._registry.values())


class MetricAccumulator:
    """Base class of reduce states (Forge-compatible).

    Subclasses implement ``append`` (hot path: plain float in), ``get_value`` (this
    process's reduction), ``get_state`` (numbers only: it travels over OTLP) and the
    classmethod ``get_reduced_value_from_states`` (exact cross-process merge).
    """

    # Slotted for the hot path; ``__dict__`` and ``__weakref__`` keep subclasses (Forge's, the
    # user's) free to set attributes of their own and to be weakly referenced.
    __slots__ = ("__dict__", "__weakref__", "is_reset", "reduction_type")

    def __init__(self, reduction: Reduce) -> None:
        self.reduction_type = reduction
        self.is_reset = True

    def append(self, value: float) -> None:
        raise NotImplementedError

    def get_value(self) -> Value:
        return type(self).get_reduced_value_from_states([self.get_state()])

    def get_state(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def get_reduced_value_from_states(cls, states: Sequence[dict[str, Any]]) -> Value:
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError


class MeanAccumulator(MetricAccumulator):
    """Count-weighted mean: merging sums and counts is exact for any split of the values."""

    __slots__ = ("count", "sum")

    def __init__(self, reduction: Reduce) -> None:
        super().__init__(reduction)
        self.sum = 0.0
        self.count = 0

    def append(self, value: float) -> None:
        self.sum += value
        self.count += 1

    def append_weighted(self, value: float, weight: int) -> None:
        """``value`` counted ``weight`` times (a token-weighted mean stays exact across processes)."""
        self.sum += value * weight
        self.count += weight

    def get_state(self) -> dict[str, Any]:
        return {"reduction_type": self.reduction_type.value, "sum": self.sum, "count": self.count}

    @classmethod
    def get_reduced_value_from_states(cls, states: Sequence[dict[str, Any]]) -> Value:
        count = sum(s["count"] for s in states)
        return sum(s["sum"] for s in states) / count if count else 0.0

    def reset(self) -> None:
        self.sum = 0.0
        self.count = 0


class SumAccumulator(MetricAccumulator):
    __slots__ = ("sum",)

    def __init__(self, reduction: Reduce) -> None:
        super().__init__(reduction)
        self.sum = 0.0

    def append(self, value: float) -> None:
        self.sum += value

    def get_state(self) -> dict[str, Any]:
        return {"reduction_type": self.reduction_type.value, "sum": self.sum}

    @classmethod
    def get_reduced_value_from_states(cls, states: Sequence[dict[str, Any]]) -> Value:
        return float(sum(s["sum"] for s in states))

    def reset(self) -> None:
        self.sum = 0.0


class MaxAccumulator(MetricAccumulator):
    """Max with NaN kept: once a NaN is seen the result is NaN (as numpy's max)."""

    __slots__ = ("max",)

    def __init__(self, reduction: Reduce) -> None:
        super().__init__(reduction)
        self.max = -math.inf

    def append(self, value: float) -> None:
        # NaN stays sticky: once max is NaN, nothing replaces it.
        if (value > self.max or value != value) and self.max == self.max:
            self.max = value

    def get_state(self) -> dict[str, Any]:
        return {"reduction_type": self.reduction_type.value, "max": self.max}

    @classmethod
    def get_reduced_value_from_states(cls, states: Sequence[dict[str, Any]]) -> Value:
        values = [s["max"] for s in states]
        return _NAN if any(v != v for v in values) else max(values, default=-math.inf)

    def reset(self) -> None:
        self.max = -math.inf


class MinAccumulator(MetricAccumulator):
    """Min with NaN kept, as ``MaxAccumulator``."""

    __slots__ = ("min",)

    def __init__(self, reduction: Reduce) -> None:
        super().__init__(reduction)
        self.min = math.inf

    def append(self, value: float) -> None:
        if (value < self.min or value != value) and self.min == self.min:
            self.min = value

    def get_state(self) -> dict[str, Any]:
        return {"reduction_type": self.reduction_type.value, "min": self.min}

    @classmethod
    def get_reduced_value_from_states(cls, states: Sequence[dict[str, Any]]) -> Value:
        values = [s["min"] for s in states]
        return _NAN if any(v != v for v in values) else min(values, default=math.inf)

    def reset(self) -> None:
        self.min = math.inf


class StdAccumulator(MetricAccumulator):
    """Population standard deviation (ddof=0), pooled from sum, sum of squares and count."""

    __slots__ = ("count", "sum", "sum_sq")

    def __init__(self, reduction: Reduce) -> None:
        super().__init__(reduction)
        self.sum = 0.0
        self.sum_sq = 0.0
        self.count = 0

    def append(self, value: float) -> None:
        self.sum += value
        self.sum_sq += value * value
        self.count += 1

    def get_state(self) -> dict[str, Any]:
        return {
            "reduction_type": self.reduction_type.value,
            "sum": self.sum,
            "sum_sq": self.sum_sq,
            "count": self.count,
        }

    @classmethod
    def get_reduced_value_from_states(cls, states: Sequence[dict[str, Any]]) -> Value:
        count = sum(s["count"] for s in states)
        if not count:
            return 0.0
        mean = sum(s["sum"] for s in states) / count
        variance = sum(s["sum_sq"] for s in states) / count - mean * mean
        # Rounding can make a zero variance slightly negative; NaN must stay NaN.
        return math.sqrt(variance) if variance > 0 else (variance if variance != variance else 0.0)

    def reset(self) -> None:
        self.sum = 0.0
        self.sum_sq = 0.0
        self.count = 0


class CountAccumulator(MetricAccumulator):
    __slots__ = ("count",)

    def __init__(self, reduction: Reduce) -> None:
        super().__init__(reduction)
        self.count = 0

    def append(self, value: float) -> None:
        self.count += 1

    def get_state(self) -> dict[str, Any]:
        return {"reduction_type": self.reduction_type.value, "count": self.count}

    @classmethod
    def get_reduced_value_from_states(cls, states: Sequence[dict[str, Any]]) -> Value:
        return float(sum(s["count"] for s in states))

    def reset(self) -> None:
        self.count = 0


class LastAccumulator(MetricAccumulator):
    """The most recent value; across processes, the one recorded last by wall clock."""

    __slots__ = ("time_unix_nano", "value")

    def __init__(self, reduction: Reduce) -> None:
        super().__init__(reduction)
        self.value = _NAN
        self.time_unix_nano = 0

    def append(self, value: float) -> None:
        self.value = value
        self.time_unix_nano = time.time_ns()

    def get_state(self) -> dict[str, Any]:
        return {
            "reduction_type": self.reduction_type.value,
            "value": self.value,
            "time_unix_nano": self.time_unix_nano,
        }

    @classmethod
    def get_reduced_value_from_states(cls, states: Sequence[dict[str, Any]]) -> Value:
        if not states:
            return _NAN
        return float(max(states, key=lambda s: s["time_unix_nano"])["value"])

    def reset(self) -> None:
        self.value = _NAN
        self.time_unix_nano = 0


DISTRIBUTION_SCALE = 6
"""Log-bucket resolution: 2**6 = 64 buckets per power of two, base 2**(1/64).

Buckets follow OpenTelemetry's exponential histogram (bucket ``i`` holds
``(base**i, base**(i+1)]``), so a state is an OTel ExponentialHistogram point.
A percentile is reported as the bucket's harmonic midpoint clamped to [min, max], so
its relative error against the exact value at the same rank is at most
``(base - 1) / (base + 1)`` = 0.542 %.
"""
DISTRIBUTION_RELATIVE_ERROR = (2 ** (2**-DISTRIBUTION_SCALE) - 1) / (2 ** (2**-DISTRIBUTION_SCALE) + 1)
DISTRIBUTION_QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
_INDEX_FACTOR = 2.0**DISTRIBUTION_SCALE


def bucket_index(magnitude: float) -> int:
    """OTel exponential-histogram index of a positive finite magnitude at DISTRIBUTION_SCALE."""
    return math.ceil(math.log2(magnitude) * _INDEX_FACTOR) - 1


class DistributionAccumulator(MetricAccumulator):
    """Percentiles (p50/p90/p99) from log-scale buckets that merge exactly by adding counts.

    Non-finite values count toward ``count``, ``sum``, ``min`` and ``max`` (so a NaN or
    inf shows in the mean) but not toward the percentiles, which rank finite values.
    """

    __slots__ = ("count", "max", "min", "negative", "positive", "sum", "zero_count")
    count: int
    sum: float
    min: float
    max: float
    zero_count: int
    positive: dict[int, int]
    negative: dict[int, int]

    def __init__(self, reduction: Reduce) -> None:
        super().__init__(reduction)
        self.reset()

    def append(self, value: float) -> None:
        self.count += 1
        self.sum += value
        if value < self.min or value != value:
            self.min = value
        if value > self.max or value != value:
            self.max = value
        if value == 0.0:
            self.zero_count += 1
        elif value - value == 0.0:  # finite
            buckets = self.positive if value > 0 else self.negative
            index = bucket_index(abs(value))
            buckets[index] = buckets.get(index, 0) + 1

    def get_state(self) -> dict[str, Any]:
        return {
            "reduction_type": self.reduction_type.value,
            "scale": DISTRIBUTION_SCALE,
            "count": self.count,
            "sum": self.sum,
            "min": self.min,
            "max": self.max,
            "zero_count": self.zero_count,
            "positive": dict(self.positive),
            "negative": dict(self.negative),
        }

    @classmethod
    def get_reduced_value_from_states(cls, states: Sequence[dict[str, Any]]) -> Value:
        count = sum(s["count"] for s in states)
        total = sum(s["sum"] for s in states)
        lo = min((s["min"] for s in states), default=math.inf)
        hi = max((s["max"] for s in states), default=-math.inf)
        if any(s["min"] != s["min"] for s in states):
            lo = hi = _NAN
        positive: dict[int, int] = {}
        negative: dict[int, int] = {}
        zeros = 0
        for s in states:
            shift = s.get("scale", DISTRIBUTION_SCALE) - DISTRIBUTION_SCALE
            if shift < 0:
                raise ValueError(f"distribution state at scale {s['scale']} is coarser than {DISTRIBUTION_SCALE}")
            zeros += s["zero_count"]
            for mine, theirs in ((positive, s["positive"]), (negative, s["negative"])):
                for index, n in theirs.items():
                    index = int(index) >> shift  # downscale finer states exactly
                    mine[index] = mine.get(index, 0) + n
        result = quantiles(positive, negative, zeros, DISTRIBUTION_SCALE, lo, hi)
        result["mean"] = total / count if count else _NAN
        return result

    def reset(self) -> None:
        self.count = 0
        self.sum = 0.0
        self.min = math.inf
        self.max = -math.inf
        self.zero_count = 0
        self.positive = {}
        self.negative = {}


def quantiles(
    positive: dict[int, int], negative: dict[int, int], zeros: int, scale: int, lo: float, hi: float
) -> dict[str, float]:
    """p50/p90/p99 of exponential-histogram buckets at ``scale`` (harmonic bucket midpoints,
    clamped to the exact extremes ``lo``/``hi`` where they are finite)."""
    ordered: list[tuple[float, int]] = []  # ascending order of value: most negative first
    width = 2.0**-scale  # of a bucket, in powers of two
    for index in sorted(negative, reverse=True):
        ordered.append((-_harmonic_mid(index, width), negative[index]))
    if zeros:
        ordered.append((0.0, zeros))
    for index in sorted(positive):
        ordered.append((_harmonic_mid(index, width), positive[index]))
    finite = sum(n for _, n in ordered)
    return {
        name: _rank_value(ordered, max(1, math.ceil(q * finite)), lo, hi) if finite else _NAN
        for name, q in DISTRIBUTION_QUANTILES
    }


def _harmonic_mid(index: int, width: float) -> float:
    """The harmonic mean of bucket ``index``'s bounds ``2**(index * width)`` and ``2**((index + 1) * width)``;
    bounds past the doubles are 0 or inf (a coarse scale's top bucket, the smallest double's)."""
    lower, upper = _power_of_two(index * width), _power_of_two((index + 1) * width)
    return 2.0 / (1.0 / lower + 1.0 / upper) if lower else 0.0


def _power_of_two(exponent: float) -> float:
    try:
        return math.pow(2.0, exponent)  # typed float (``float ** float`` is Any); overflows the same way
    except OverflowError:
        return math.inf


def _rank_value(ordered: list[tuple[float, int]], rank: int, lo: float, hi: float) -> float:
    seen = 0
    for value, n in ordered:
        seen += n
        if seen >= rank:
            # Clamp to the exact extremes where they are finite (the tails are then exact).
            if lo - lo == 0.0 and value < lo:
                return lo
            if hi - hi == 0.0 and value > hi:
                return hi
            return value
    return ordered[-1][0]


for _name, _cls in (
    ("mean", MeanAccumulator),
    ("sum", SumAccumulator),
    ("max", MaxAccumulator),
    ("min", MinAccumulator),
    ("std", StdAccumulator),
    ("count", CountAccumulator),
    ("last", LastAccumulator),
    ("distribution", DistributionAccumulator),
):
    Reduce.register(_name, _cls)

BUILTIN_REDUCES = frozenset(Reduce._registry)


class _SampleRows(MetricAccumulator):
    """``Reduce.SAMPLE`` (Forge's form of ``record_sample``): its rows go to a sample table and
    never into an accumulator, so it is not a reduce type a metric point can carry."""

    def append(self, value: float) -> None:
        raise TypeError("Reduce.SAMPLE rows go to record_sample")


Reduce.SAMPLE = Reduce("sample", _SampleRows)
Reduce._registry["sample"] = Reduce.SAMPLE  # found by name (pickled across actors), after BUILTIN_REDUCES


def reduced_items(key: str, value: Value) -> list[tuple[str, float]]:
    """Flatten a reduced value to (name, number) pairs: ``key`` or ``key/p50`` ..."""
    if isinstance(value, dict):
        return [(f"{key}/{suffix}", v) for suffix, v in value.items()]
    return [(key, value)]
