"""The sink's counts and notes by kind (``sink.tally``): a client's names make no new kinds, and a
flood of one kind of note writes one log line per interval and leaves the other kinds listed."""

from __future__ import annotations

import logging

import pytest

from rankscope.sink.testing import Notes, Refusals, kind_of


def test_a_kind_is_a_reason_without_its_names_and_numbers_whatever_the_names_hold() -> None:
    assert kind_of("metric 'loss': unknown reduce type 'median'") == "unknown reduce type …"
    assert kind_of("resume: experiment 'x' has no run 'r12'") == "experiment … has no run …"
    hostile = ["a:b", "it's", 'say "hi"', "both ' and \"", "x\\y", "12:34"]
    kinds = {kind_of(f"resume: experiment {name!r} has no run {name!r}") for name in hostile}
    assert kinds == {"experiment … has no run …"}  # quotes, colons and escapes inside a name change nothing


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_notes_log_each_kind_once_per_interval_with_the_count_left_unsaid(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    notes = Notes(interval=10.0, shown=3, clock=clock)
    with caplog.at_level(logging.WARNING, logger="rankscope.sink"):
        notes.add("run 'a' resumed by launch 'b' (attempt 1)")
        for i in range(2000):
            notes.add(f"resume: experiment 'x' has no run 'gone-{i}'")
        clock.now += 10.0
        notes.add("resume: experiment 'x' has no run 'gone-2000'")
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "rankscope sink: run 'a' resumed by launch 'b' (attempt 1)",
        "rankscope sink: resume: experiment 'x' has no run 'gone-0'",
        "rankscope sink: resume: experiment 'x' has no run 'gone-2000' (and 1999 more like it in the last 10 s)",
    ]
    assert notes.listed() == [
        "run 'a' resumed by launch 'b' (attempt 1)",
        "resume: experiment 'x' has no run 'gone-2000' [2001 of this kind]",
    ]
    for kind in ("a", "b", "c"):  # the newest `shown` kinds are listed, the least recently said go first
        notes.add(f"replaying run {kind}: 1 points refused")
        notes.add(f"{kind}: something else {kind}")
    assert len(notes.listed()) == 3 and notes.listed()[-1] == "c: something else c"


def test_a_request_says_each_distinct_reason_once() -> None:
    refused = Refusals()
    for _ in range(16):
        refused.add(1, "past its disk budget")
    refused.add(2, "another launch reuses its id")
    assert refused.count == 18
    assert refused.message == "past its disk budget; another launch reuses its id"
