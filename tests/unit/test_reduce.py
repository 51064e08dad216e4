"""Reduce states merge exactly, whatever the split of values across processes."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from rankscope import DISTRIBUTION_RELATIVE_ERROR, MetricAccumulator, Reduce


def _states(reduce: Reduce, parts: list[list[float]]) -> list[dict]:
    states = []
    for part in parts:
        acc = reduce.accumulator_class(reduce)
        for v in part:
            acc.append(v)
        states.append(acc.get_state())
    return states


def _split(values: list[float], n: int, rng: random.Random) -> list[list[float]]:
    parts: list[list[float]] = [[] for _ in range(n)]
    for v in values:
        parts[rng.randrange(n)].append(v)
    return [p for p in parts if p]


@pytest.mark.parametrize("seed", range(5))
def test_scalar_reduces_merge_exactly(seed: int) -> None:
    rng = random.Random(seed)
    values = [rng.uniform(-50, 150) for _ in range(rng.randint(5, 400))]
    parts = _split(values, rng.randint(1, 8), rng)
    expected = {
        Reduce.MEAN: np.mean(values),
        Reduce.SUM: np.sum(values),
        Reduce.MAX: max(values),
        Reduce.MIN: min(values),
        Reduce.STD: np.std(values),
        Reduce.COUNT: len(values),
    }
    for reduce, want in expected.items():
        got = reduce.accumulator_class.get_reduced_value_from_states(_states(reduce, parts))
        assert got == pytest.approx(want, rel=1e-9, abs=1e-9), reduce


def test_last_is_latest_by_record_time() -> None:
    first = Reduce.LAST.accumulator_class(Reduce.LAST)
    first.append(1.0)
    second = Reduce.LAST.accumulator_class(Reduce.LAST)
    second.append(2.0)
    states = [second.get_state(), first.get_state()]
    assert Reduce.LAST.accumulator_class.get_reduced_value_from_states(states) == 2.0


@pytest.mark.parametrize("reduce", [Reduce.MEAN, Reduce.SUM, Reduce.MAX, Reduce.MIN, Reduce.STD])
def test_nan_is_kept(reduce: Reduce) -> None:
    got = reduce.accumulator_class.get_reduced_value_from_states(_states(reduce, [[1.0, math.nan, 3.0], [2.0]]))
    assert math.isnan(got)


def test_inf_is_kept() -> None:
    assert (
        Reduce.MAX.accumulator_class.get_reduced_value_from_states(_states(Reduce.MAX, [[1.0], [math.inf]])) == math.inf
    )
    assert (
        Reduce.MEAN.accumulator_class.get_reduced_value_from_states(_states(Reduce.MEAN, [[-math.inf, 1.0]]))
        == -math.inf
    )


@pytest.mark.parametrize("seed", range(4))
def test_distribution_percentiles_within_documented_bound(seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = np.concatenate([rng.lognormal(0, 3, 3000), -rng.lognormal(1, 1, 500), np.zeros(50)])
    rng.shuffle(values)
    parts = [list(map(float, p)) for p in np.array_split(values, 7)]
    got = Reduce.DISTRIBUTION.accumulator_class.get_reduced_value_from_states(_states(Reduce.DISTRIBUTION, parts))
    ordered = np.sort(values)
    for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        exact = ordered[math.ceil(q * len(values)) - 1]  # nearest rank
        assert abs(got[name] - exact) <= DISTRIBUTION_RELATIVE_ERROR * abs(exact) + 1e-12, (name, got[name], exact)
    assert got["mean"] == pytest.approx(values.mean())
    assert DISTRIBUTION_RELATIVE_ERROR < 0.0055


def test_distribution_non_finite_shows_in_mean_not_percentiles() -> None:
    got = Reduce.DISTRIBUTION.accumulator_class.get_reduced_value_from_states(
        _states(Reduce.DISTRIBUTION, [[1.0, 2.0, math.inf], [3.0]])
    )
    assert got["mean"] == math.inf
    assert got["p50"] == pytest.approx(2.0, rel=DISTRIBUTION_RELATIVE_ERROR)


class WordCount(MetricAccumulator):
    """A user's reduce type: counts values above a threshold (Forge-style accumulator)."""

    def __init__(self, reduction: Reduce) -> None:
        super().__init__(reduction)
        self.hits = 0

    def append(self, value: float) -> None:
        self.hits += value > 10

    def get_state(self) -> dict:
        return {"reduction_type": self.reduction_type.value, "hits": self.hits}

    @classmethod
    def get_reduced_value_from_states(cls, states: list[dict]) -> float:
        return float(sum(s["hits"] for s in states))

    def reset(self) -> None:
        self.hits = 0


def test_register_custom_reduce() -> None:
    reduce = Reduce.register("above_ten", WordCount)
    assert Reduce.get("above_ten") is reduce is Reduce.ABOVE_TEN  # type: ignore[attr-defined]
    assert Reduce.register("above_ten", WordCount) is reduce  # idempotent
    with pytest.raises(ValueError, match="already registered"):
        Reduce.register("above_ten", MetricAccumulator)
    with pytest.raises(TypeError):
        Reduce.register("bad", dict)  # type: ignore[arg-type]
    assert reduce.accumulator_class.get_reduced_value_from_states(_states(reduce, [[1, 20], [30, 5]])) == 2.0


def test_unknown_reduce_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="mean"):
        Reduce.get("median")


def test_reduce_pickles_by_name() -> None:
    import pickle

    assert pickle.loads(pickle.dumps(Reduce.STD)) is Reduce.STD
