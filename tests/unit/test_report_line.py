"""Where the process that started the job's sink says the report is: only once the sink wrote its
last step (a view's location comes with its first write; a short job ends inside the sink's start
hold, and its line was once missing 1 run in 3)."""

from __future__ import annotations

import time

from rankscope.lifecycle.shutdown import _UNSAID, _page_of, _run_over, _waits_for_end

PAGE = "/runs/main/20261130-1/report.html"


def _status(written: int, location: str | None) -> dict[str, object]:
    views = {
        "console": {"location": "stdout", "last_written_step": written, "disabled": False},
        "report": {"location": location, "last_written_step": written, "disabled": False},
    }
    return {"last_written_step": written, "views": views}


def test_the_page_is_said_once_the_sink_wrote_the_last_step_and_not_before() -> None:
    assert _page_of(_status(-1, None), last=5) is _UNSAID  # nothing written yet: ask again
    assert _page_of(_status(2, PAGE), last=5) == PAGE  # its location is known from its first write
    assert _page_of(_status(5, PAGE), last=5) == PAGE


def test_a_run_without_a_page_says_nothing_once_its_last_step_is_written() -> None:
    status = _status(5, None)
    status["views"] = {"console": {"location": "stdout", "last_written_step": 5, "disabled": False}}
    assert _page_of(status, last=5) is None
    assert _page_of(status, last=None) is None  # a process that never flushed waits for nothing
    disabled = _status(5, PAGE)
    disabled["views"]["report"]["disabled"] = True  # type: ignore[index]
    assert _page_of(disabled, last=5) is None


def test_the_run_is_over_once_every_process_said_goodbye_and_every_step_is_written() -> None:
    """The starter of the job's sink says where the report is after the job's last lines: once the
    run ended (a failed rank's step is final at the last goodbye) and the views wrote it."""
    over = {**_status(3, PAGE), "run": "r1", "open_steps": 0, "last_finalized_step": 3}
    over["runs"] = [{"run": "r0", "ended": True}, {"run": "r1", "ended": True}]
    assert _run_over(over)
    assert not _run_over({**over, "runs": [{"run": "r1", "ended": False}, {"run": "r0", "ended": True}]})
    assert not _run_over({**over, "open_steps": 1})  # the last goodbye came, its step not final yet
    assert not _run_over({**over, "last_written_step": 2})  # final, not yet written (printed)
    for odd in (None, {}, {**over, "open_steps": None}, {**over, "last_written_step": "3"}, {**over, "runs": "r1"}):
        assert not _run_over(odd)  # a sink of another version, or an odd answer: not over, never raised


def test_only_a_failed_run_is_waited_for_and_only_so_long() -> None:
    """A run nobody failed in is said at once (no exit delay where the roster never ends: a node's
    own sink of a multi-node job); a failed one until it is over, or its patience ran out."""
    going = {**_status(3, PAGE), "run": "r1", "open_steps": 1, "last_finalized_step": 2, "failed": []}
    going["runs"] = [{"run": "r1", "ended": False}]
    now = time.monotonic()
    assert not _waits_for_end(going, now, patience=5.0)
    failed = {**going, "failed": ["trainer_r1"]}
    assert _waits_for_end(failed, now, patience=5.0)
    assert not _waits_for_end(failed, now - 6.0, patience=5.0)  # waited long enough
    over = {**failed, "open_steps": 0, "last_finalized_step": 3, "runs": [{"run": "r1", "ended": True}]}
    assert not _waits_for_end(over, now, patience=5.0)
    assert not _waits_for_end(None, now, patience=5.0) and not _waits_for_end({"failed": "x"}, now, 0.0)
