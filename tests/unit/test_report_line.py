"""Where the process that started the job's sink says the report is: only once the sink wrote its
last step (a view's location comes with its first write; a short job ends inside the sink's start
hold, and its line was once missing 1 run in 3)."""

from __future__ import annotations

from rankscope.lifecycle.shutdown import _UNSAID, _page_of

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
