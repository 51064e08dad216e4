"""Sample tables' selection (``rankscope.metrics.samples``): rows checked at the call site, the
top/bottom k exact across processes, and the mergeable reservoir fair to every process."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankscope.metrics.samples import TableSample, check_row, merge


def test_a_bad_row_raises_naming_the_table_and_a_long_string_is_cut_and_marked() -> None:
    with pytest.raises(TypeError, match=r"record_sample\('rollouts'\): field 'tokens' is a list"):
        check_row("rollouts", {"tokens": [1, 2]})
    with pytest.raises(TypeError, match=r"record_sample\('rollouts'\): row must be a mapping"):
        check_row("rollouts", [("a", 1)])
    with pytest.raises(TypeError, match="field names must be non-empty str"):
        check_row("rollouts", {3: "x"})
    row = check_row("rollouts", {"text": "x" * 5000, "reward": 1.5, "ok": True})
    assert row["text"] == "x" * 4073 + "…[927 more characters]" and row["reward"] == 1.5 and row["ok"] is True
    assert len(row["text"]) <= 4096 and check_row("rollouts", row) == row  # a sink does not cut it again
    with pytest.raises(ValueError, match=r"rank_by field 'reward' must be a number"):
        TableSample("rollouts", "reward", 2).add({"reward": "high"})
    with pytest.raises(ValueError, match="k must be an int"):
        TableSample("rollouts", None, 0)


@settings(max_examples=200, deadline=None)
@given(
    rewards=st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=60, unique=True),
    processes=st.integers(1, 6),
    k=st.integers(1, 5),
)
def test_top_and_bottom_k_merge_exactly_from_per_process_preselections(
    rewards: list[float], processes: int, k: int
) -> None:
    """However the rows are spread over processes, merging the processes' 2k rows gives exactly
    the k highest and k lowest of all rows."""
    local = [TableSample("t", "reward", k) for _ in range(processes)]
    for i, reward in enumerate(rewards):
        local[i % processes].add({"reward": reward, "i": i})
    merged = merge([kept for sample in local for kept in sample.kept()], "reward", k)
    top = [r.row["reward"] for r in merged if r.side == "top"]
    bottom = [r.row["reward"] for r in merged if r.side == "bottom"]
    assert top == sorted(rewards, reverse=True)[:k] and bottom == sorted(rewards)[:k]
    assert all(len(sample.kept()) <= 2 * k for sample in local)


def test_a_nan_is_kept_at_both_ends() -> None:
    sample = TableSample("t", "reward", 1)
    for reward in (1.0, float("nan"), -1.0):
        sample.add({"reward": reward})
    top, bottom = sample.kept()
    assert top.key != top.key and bottom.key != bottom.key


def test_the_reservoir_keeps_each_processes_rows_in_proportion_to_how_many_it_recorded() -> None:
    """3 processes record 10, 30 and 60 rows a step, k = 8, 2,000 steps (seed 7): each process's
    share of the kept rows is its share of the recorded rows, within 0.02 (about 5 standard errors)."""
    rng = random.Random(7)
    counts, kept_from = (10, 30, 60), [0, 0, 0]
    for _ in range(2000):
        local = [TableSample("t", None, 8, rng) for _ in counts]
        for p, n in enumerate(counts):
            for i in range(n):
                local[p].add({"process": p, "i": i})
        merged = merge([kept for sample in local for kept in sample.kept()], None, 8)
        assert len(merged) == 8
        for row in merged:
            kept_from[int(row.row["process"])] += 1
    shares = [n / sum(kept_from) for n in kept_from]
    assert shares == pytest.approx([0.1, 0.3, 0.6], abs=0.02)
