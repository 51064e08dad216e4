"""``rankscope top`` at any width: keys cut in the middle and still distinct (``fit``), the user's
own keys first (``default_keys``), the step rate from the job's own step times (``step_rate``)."""

from __future__ import annotations

import io
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from rankscope.cli.top import default_keys, fit, render, shorten, step_rate

JOB_KEYS = [  # what a plain torchrun job's step showed first (the sink's order), `loss` after them
    "train/data/duration_avg_s",
    "train/data/duration_max_s",
    "train/data/duration_max_s/argmax_rank",
    "comm/all_reduce/duration_avg_s",
    "comm/all_reduce/duration_max_s",
    "comm/all_reduce/bytes",
    "rankscope/step_time_s",
    "straggler/train/data/late_rank",
    "train/total_duration_avg_s",
    "optimizer/lr/group_0",
    "loss",
    "accuracy",
]


def test_a_key_is_cut_in_the_middle_keeping_its_end() -> None:
    assert shorten("comm/all_reduce/duration_max_s", 30) == "comm/all_reduce/duration_max_s"
    cut = shorten("comm/all_reduce/duration_max_s", 21)
    assert cut == "comm/all…ration_max_s"  # two fifths of its start, the rest of its end


def test_keys_the_terminal_cut_to_one_text_stay_distinct() -> None:
    """At 80 columns the key column was 21 wide: ``train/data/duration_…`` three times."""
    shown = fit(JOB_KEYS, 21)
    assert len(set(shown.values())) == len(JOB_KEYS), shown
    assert all(len(text) <= 21 for text in shown.values()), shown
    assert shown["train/data/duration_avg_s"].endswith("avg_s")
    assert shown["train/data/duration_max_s"].endswith("max_s")
    assert shown["loss"] == "loss"


def test_keys_that_differ_only_in_the_middle_are_cut_where_they_differ() -> None:
    keys = [f"validation/{'x' * 20}{i}{'y' * 20}/loss" for i in range(3)]
    shown = fit(keys, 20)
    assert len(set(shown.values())) == 3 and all(len(text) <= 20 for text in shown.values()), shown
    assert [str(i) in text for i, text in enumerate(shown[k] for k in keys)] == [True] * 3, shown


@given(
    st.lists(st.text(alphabet="ab/_", min_size=1, max_size=40), min_size=1, max_size=12, unique=True),
    st.integers(min_value=6, max_value=40),
)
def test_fit_keeps_any_keys_distinct_within_the_width(keys: list[str], width: int) -> None:
    shown = fit(keys, width)
    assert len(set(shown.values())) == len(keys), shown
    assert all(len(text) <= width for text in shown.values()), shown
    assert all(shown[k] == k for k in keys if len(k) <= width), shown  # a key that fits is shown whole


def test_the_users_keys_come_first_then_phases_then_rankscopes_own() -> None:
    recent = [{"step": 1, "values": dict.fromkeys(JOB_KEYS, 1.0)}]
    assert default_keys(recent) == [
        "loss",
        "accuracy",
        "train/data/duration_avg_s",
        "train/data/duration_max_s",
        "train/total_duration_avg_s",
        "comm/all_reduce/duration_avg_s",
    ]
    assert default_keys(recent, 20)[-4:] == [  # never the sink's views, nor a key's argmax rank
        "comm/all_reduce/duration_avg_s",
        "comm/all_reduce/duration_max_s",
        "comm/all_reduce/bytes",
        "optimizer/lr/group_0",
    ]


def test_a_key_only_earlier_steps_had_keeps_its_row() -> None:
    recent = [{"step": 1, "values": {"eval_loss": 2.0, "loss": 1.0}}, {"step": 2, "values": {"loss": 0.5}}]
    assert default_keys(recent) == ["loss", "eval_loss"]


def _finished(durations: list[float | None]) -> list[dict[str, Any]]:
    """A finished run's steps as the recent route gave them: finalized as a backlog, 5 ms apart."""
    return [
        {"step": i, "time": 100.0 + i * 0.005, "duration": d, "values": {"loss": 1.0 / (i + 1)}, "missing": []}
        for i, d in enumerate(durations)
    ]


def test_the_step_rate_is_the_jobs_not_how_fast_the_sink_finalized_a_backlog() -> None:
    recent = _finished([None, *[0.5] * 20])
    assert step_rate(recent) == 2.0
    first = _finished([30.0, 0.5, 0.5])
    first[0]["from_start"] = True  # the first step, timed from the job's start: its set-up is not the pace
    assert step_rate(first) == 2.0
    assert step_rate(_finished([None, None])) is None  # unknown: no step's time
    assert step_rate([{"step": 1, "time": 1.0}, {"step": 2, "time": 1.001}]) is None  # a sink without durations
    assert "2 steps/s" in _screen(recent, 80)
    assert " - steps/s" in _screen(_finished([None, None]), 80)


def _screen(recent: list[dict[str, Any]], width: int, keys: list[str] | None = None) -> str:
    snap: dict[str, Any] = {"experiments": [{"id": "exp", "run": "r", "processes": 2, "last_finalized_step": 20}]}
    snap |= {"experiment": "exp", "run": "r", "status": {"processes": 2}, "recent": recent}
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(render(snap, keys, now=200.0))
    return console.export_text()


def test_at_80_columns_the_keys_rows_are_distinct_and_nothing_says_none() -> None:
    values = dict.fromkeys(JOB_KEYS, -0.000123456)  # numbers as wide as they come: the keys get less room
    recent = [{"step": s, "time": 100.0 + s, "duration": 1.0, "values": values} for s in range(64)]
    recent[-1]["phases"] = {
        "comm/all_reduce": {"trainer_r0": 0.001, "trainer_r1": 0.002},
        "train/backward": {"trainer_r0": 0.01, "trainer_r1": 0.01},
        "train/forward_and_the_loss": {"trainer_r0": 0.02, "trainer_r1": 0.03},
    }
    text = _screen(recent, 80, keys=JOB_KEYS[:6])
    assert all(len(line) <= 80 for line in text.splitlines()), text
    rows = [line.split("│")[1].strip() for line in text.splitlines() if "-0.0001235" in line]
    assert len(rows) == 6 and len(set(rows)) == 6 and sum("…" in row for row in rows) >= 3, text
    assert "train/forward_and_the_loss" in text and "comm/all_reduce" in text, text  # phases whole
    assert "None" not in text
