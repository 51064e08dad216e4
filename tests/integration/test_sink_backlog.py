"""A step's grace is the clients' time: a request the sink received in time holds it (``edge.backlog``),
in a real sink's finalizer."""

from __future__ import annotations

import time
from typing import Any

from rankscope.sink import BookConfig

from ..victim import step_request


def _recent(sink: Any, experiment: str) -> list[dict[str, Any]]:
    return sink.queries.recent(experiment) or []


def _finalized(sink: Any, experiment: str, when: Any = bool, timeout: float = 10.0) -> dict[str, Any]:
    """The experiment's one recent step, once ``when`` holds of the recent rows (a step finalized)."""
    deadline = time.monotonic() + timeout
    while not when(_recent(sink, experiment)) and time.monotonic() < deadline:
        time.sleep(0.02)
    (found,) = _recent(sink, experiment)
    return found


def test_a_step_waits_past_its_grace_for_a_request_received_in_time_and_is_exact(make_sink) -> None:
    """Rank 1's request came before step 0's grace ended but is still being taken (the sink busy
    with other clients' large requests): the step is not finalized without it, and is exact."""
    sink = make_sink(http_port=None, book=BookConfig(grace=0.3))
    sink.export_metrics(step_request("busy", "r", 0, 0))
    with sink.backlog.held():  # rank 1's request, received now, taken only after the grace
        time.sleep(1.0)
        assert _recent(sink, "busy") == [], "finalized while a request received in time was being taken"
        sink.export_metrics(step_request("busy", "r", 1, 0))
    found = _finalized(sink, "busy")
    assert found["values"]["loss"] == 0.5 and found["values"]["top"] == 1.0
    assert found["missing"] == []


def test_without_a_backlog_the_grace_passes_as_before(make_sink) -> None:
    """The same step with no request in the sink: final without rank 1 once its grace passed."""
    sink = make_sink(http_port=None, book=BookConfig(grace=0.3))
    sink.export_metrics(step_request("quiet", "r", 0, 0))
    found = _finalized(sink, "quiet")
    assert found["values"]["loss"] == 0.0 and found["missing"] == ["trainer_r1"]


def test_the_recent_route_shows_a_corrected_step_as_its_exact_total(make_sink) -> None:
    """``rankscope top`` reads the recent route: a step finalized without rank 1 shows rank 0's
    values, then, once rank 1's part came late, the step's exact total, marked late."""
    sink = make_sink(http_port=None, book=BookConfig(grace=0.3))
    sink.export_metrics(step_request("top", "r", 0, 0))
    first = _finalized(sink, "top")
    assert first["values"]["loss"] == 0.0 and first["missing"] == ["trainer_r1"]
    sink.export_metrics(step_request("top", "r", 1, 0))
    corrected = _finalized(sink, "top", when=lambda rows: rows and rows[0].get("late"))
    assert corrected["values"]["loss"] == 0.5 and corrected["values"]["top"] == 1.0
    assert corrected["missing"] == [] and corrected["late"] is True
