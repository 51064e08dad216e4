"""The rank whose values diverge (``sink.book.spread``, ``sink.book.outliers``, the outlier detector):
each key's extreme process against the others' exact mean and spread, in O(1) per key; named per
(process, key) after a streak, never a rank within the others' noise; through a real step book."""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

from rankscope.core.anomalies import Outlier
from rankscope.metrics.reduce import Reduce
from rankscope.sink import BookConfig, StepBook
from rankscope.sink.testing import (
    CaptureBook,
    Process,
    Spread,
    StateRows,
    Thresholds,
    ask_outliers,
    judged_by,
    outliers,
    spreads,
)

from .test_sink_steps import Clock, ingest, metrics, resource


def process(rank: int, role: str = "trainer") -> Process:
    return Process(f"p{rank}", f"{role}_r{rank}", role, None, rank, 32, 0, "h", rank, {})


def rows(key: str, reduce: str, row: tuple[Any, ...]) -> StateRows:
    return StateRows(reduce, 0, [key], [row])


def test_the_others_mean_and_spread_are_exact_with_the_extreme_taken_out() -> None:
    rng = random.Random(7)
    values = [rng.gauss(2.31, 1e-4) for _ in range(999)] + [2.5]
    spread = Spread()
    for rank, value in enumerate(values):
        spread.add(value, process(rank))
    high = spread.others(high=True)
    assert high is not None and high.process.rank == 999 and high.value == 2.5 and high.others == 999
    assert abs(high.others_mean - statistics.fmean(values[:-1])) < 1e-12
    assert abs(high.others_std - statistics.stdev(values[:-1])) / statistics.stdev(values[:-1]) < 1e-6
    low = spread.others(high=False)
    rest = sorted(values)[1:]
    assert low is not None and abs(low.others_std - statistics.stdev(rest)) / statistics.stdev(rest) < 1e-6


def test_a_tie_names_the_lowest_rank_and_two_processes_name_no_one() -> None:
    spread = Spread()
    for rank in (5, 2, 9):
        spread.add(1.0 if rank != 9 else 0.0, process(rank))
    assert spread.others(high=True).process.rank == 2  # type: ignore[union-attr]
    pair = Spread()
    pair.add(1.0, process(0))
    pair.add(6.0, process(1))
    assert pair.others(high=True) is None  # which of two is off cannot be told


def step_parts(step: int, rng: random.Random, off: dict[tuple[int, str], float]) -> list[tuple[Process, StateRows]]:
    """32 processes' rows of one step: loss (MEAN of 4 samples), grad_norm (MEAN), tokens (SUM,
    differing by design), a rank id (MEAN, differing by design) and an instrumentor's key."""
    parts = []
    for rank in range(32):
        p = process(rank)
        loss = [rng.gauss(1.0, 0.01) + off.get((rank, "loss"), 0.0) for _ in range(4)]
        norm = rng.gauss(2.0, 0.05) * off.get((rank, "grad_norm"), 1.0)
        parts += [
            (p, rows("loss", "mean", (4, sum(loss)))),
            (p, rows("grad_norm", "mean", (1, norm))),
            (p, rows("tokens", "sum", (float(rng.randint(100, 900)),))),
            (p, rows("shard_id", "mean", (1, float(rank)))),
            (p, rows("optimizer/step_s", "mean", (1, 0.01 if rank != 3 else 0.5))),
        ]
    return parts


def test_of_32_processes_exactly_the_loss_and_the_grad_norm_outliers_are_candidates() -> None:
    """Rank 13's loss +0.8 and rank 27's grad norm 3x, among 32 noisy processes. SUM counters,
    rankscope's own keys and keys a rule skips are not judged."""
    rng = random.Random(3)
    thresholds = Thresholds(outlier_skip=("shard_id",))
    found = outliers(
        spreads(step_parts(5, rng, {(13, "loss"): 0.8, (27, "grad_norm"): 3.0}), judged_by(thresholds)), thresholds
    )
    named = sorted((record.process, record.key) for record, _ in found)
    assert named == [("trainer_r13", "loss"), ("trainer_r27", "grad_norm")], found
    loss = next(r for r, _ in found if r.key == "loss")
    assert (
        abs(loss.value - 1.8) < 0.02 and abs(loss.others_mean - 1.0) < 0.01 and loss.sigmas > 50 and loss.others == 31
    )
    for seed in range(20):  # no outlier: noise alone names nobody
        quiet = step_parts(5, random.Random(seed), {})
        assert outliers(spreads(quiet, judged_by(thresholds)), thresholds) == [], seed


def test_a_streak_is_named_once_after_its_steps_with_its_first_step() -> None:
    """Through a real step book and its detectors: rank 13's loss is +0.8 from step 5, rank 27's
    grad norm 3x from step 8; each named once, when its streak has held 3 judged steps. With
    ``outlier_capture`` each one's process is asked for a profile, as a straggler's is."""
    book = StepBook("x", BookConfig(grace=5, detectors=Thresholds(outlier_capture=True)), clock=Clock())
    captures = CaptureBook()
    rng = random.Random(11)
    said: list[Outlier] = []
    for step in range(14):
        for rank in range(32):
            loss = [rng.gauss(1.0, 0.01) + (0.8 if rank == 13 and step >= 5 else 0.0) for _ in range(4)]
            norm = rng.gauss(2.0, 0.05) * (3.0 if rank == 27 and step >= 8 else 1.0)
            values = {
                "loss": (Reduce.MEAN, loss),
                "grad_norm": (Reduce.MEAN, [norm]),
                "tokens": (Reduce.SUM, [rank * 10.0]),
            }
            ingest(book, resource(f"p{rank}", rank, 32), metrics(values, step=step))
        for view in book.ready():
            said += [a for a in view.anomalies if isinstance(a, Outlier)]
            ask_outliers(captures, view, 2)
    assert [(a.process, a.key, a.first_step, a.step, a.steps) for a in said] == [
        ("trainer_r13", "loss", 5, 5, 3),
        ("trainer_r27", "grad_norm", 8, 8, 3),
    ], said
    asked = [c.reason for c in captures.captures.values()]
    assert [r.split(":")[0] for r in asked] == ["outlier from step 5", "outlier from step 8"], asked
    assert "trainer_r13 loss" in asked[0] and "trainer_r27 grad_norm" in asked[1]


def test_the_judgement_per_key_does_not_grow_with_ranks() -> None:
    """Each key's spread is folded as its rows come (linear, unavoidable); judging it is O(1) per
    key: 200 keys of 1,000 and of 10,000 simulated ranks cost the same (best of 5, thread time)."""

    def judged(world: int) -> float:
        spread_by = {}
        for k in range(200):
            spread = Spread()
            for rank in range(world):
                spread.add(1.0 + (rank % 7) * 1e-3 + (0.5 if rank == world - 1 and k == 3 else 0.0), process(rank))
            spread_by[("trainer", f"k{k}")] = spread
        times = []
        for _ in range(5):
            started = time.thread_time()
            found = outliers(spread_by, Thresholds())
            times.append(time.thread_time() - started)
            assert [(r.key, r.rank) for r, _ in found] == [("k3", world - 1)]
        return min(times)

    small, large = judged(1_000), judged(10_000)
    assert large < 3 * small + 1e-3, (small, large)


def test_non_finite_values_and_processes_without_samples_are_left_to_their_own_detector() -> None:
    parts = [(process(r), rows("loss", "mean", (1, 1.0 + r * 1e-3))) for r in range(8)]
    parts += [(process(8), rows("loss", "mean", (1, float("nan")))), (process(9), rows("loss", "mean", (0, 0.0)))]
    found = spreads(parts, judged_by(Thresholds()))
    assert found[("trainer", "loss")].n == 8


def test_too_few_others_are_not_judged_and_huge_values_leave_the_spread_unknown() -> None:
    """With 4 others their spread is too noisy to judge by (``outlier_min_others``: 5); values
    near the float max overflow the moments: no spread, rather than both extremes named."""
    few = [(process(r), rows("loss", "mean", (1, 1.0 + r * 1e-3 + (5.0 if r == 4 else 0.0)))) for r in range(5)]
    assert outliers(spreads(few, judged_by(Thresholds())), Thresholds()) == []
    assert [r.rank for r, _ in outliers(spreads(few, judged_by(Thresholds())), Thresholds(outlier_min_others=4))] == [4]
    huge = [(process(r), rows("loss", "mean", (1, 1e308 if r < 2 else 1.0 + r * 1e-3))) for r in range(8)]
    assert spreads(huge, judged_by(Thresholds())) == {}


def test_a_candidates_figures_are_computed_again_from_the_others_values() -> None:
    """2.31 ± 8.5e-5 and one process at 1e6: taking 1e6 back out of the moments had left the
    others' spread at 0.0 ("the others all equal"); from their values it is their own."""
    rng = random.Random(5)
    others = [rng.gauss(2.31, 8.5e-5) for _ in range(31)]
    parts = [(process(r), rows("loss", "mean", (1, v))) for r, v in enumerate([*others, 1e6])]
    (found,) = outliers(spreads(parts, judged_by(Thresholds())), Thresholds())
    record, _ = found
    assert record.rank == 31 and abs(record.others_std - statistics.stdev(others)) < 1e-12, record


def test_a_hostile_spread_attribute_set_is_not_known_and_never_raises() -> None:
    """``otlp.metrics.read_spread`` at the sink's edge: every field of a merged point's spread
    broken in turn (wrong types, bools for ints, NaN, negative M2, low over high, ranks out of
    range, unprintable or huge labels) reads as no spread; a well-formed one reads back whole."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from rankscope.core import names as attr
    from rankscope.otlp.metrics import read_spread

    good: dict[str, Any] = {
        attr.SPREAD_N: 4,
        attr.SPREAD_MEAN: 1.0,
        attr.SPREAD_M2: 0.5,
        attr.SPREAD_LOW: 0.5,
        attr.SPREAD_LOW_RANK: 2,
        attr.SPREAD_LOW_LABEL: "trainer_r2",
        attr.SPREAD_HIGH: 1.5,
        attr.SPREAD_HIGH_RANK: 3,
        attr.SPREAD_HIGH_LABEL: "trainer_r3",
    }
    assert read_spread(good) == (4, 1.0, 0.5, 0.5, 2, "trainer_r2", 1.5, 3, "trainer_r3")
    assert read_spread({attr.SPREAD_N: 0}) == (0,)
    broken = {
        attr.SPREAD_N: [True, -1, 2**31, 1.5, "4", None],
        attr.SPREAD_MEAN: [float("nan"), float("inf"), 1, "1.0", None],
        attr.SPREAD_M2: [-0.1, float("nan")],
        attr.SPREAD_LOW: [2.0],  # over high
        attr.SPREAD_LOW_RANK: [-1, 2**31, True, 1.0, "2"],
        attr.SPREAD_HIGH_LABEL: ["\x00evil", "x" * 10_000, 5],
    }
    for key, values in broken.items():
        for value in values:
            assert read_spread({**good, key: value}) is None, (key, value)
    assert read_spread({k: v for k, v in good.items() if k != attr.SPREAD_HIGH_RANK}) is None

    values = st.one_of(
        st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20), st.binary(max_size=8)
    )

    @settings(max_examples=300, deadline=None)
    @given(st.dictionaries(st.sampled_from(sorted(good)), values))
    def fuzzed(extra: dict[str, Any]) -> None:
        found = read_spread({**good, **extra})
        assert found in (None, (0,)) or (len(found) == 9 and found[2] >= 0 and found[3] <= found[6])

    fuzzed()
