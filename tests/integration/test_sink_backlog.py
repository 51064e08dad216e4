"""A step's grace is the clients' time: a request the sink received in time holds it (``edge.backlog``),
in a real sink's finalizer."""

from __future__ import annotations

import time
from typing import Any

from rankscope.sink import BookConfig

from ..victim import Victim, step_request


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


class _LateSecondRank(Victim):
    """A victim whose thread stalls before step 2's rank-1 send (as behind a test's attacker threads)."""

    stall = 1.2

    def _request(self, rank: int, step: int) -> Any:
        if (rank, step) == (1, 2):
            time.sleep(self.stall)
        return super()._request(rank, step)


def test_a_victim_late_past_the_grace_by_itself_is_held_to_the_correction_not_the_first_view(make_sink) -> None:
    """The flood tests' victim (``tests.victim``) with a short grace: a step its own thread delivered
    slower than the grace is finalized partial, and counts only once the sink's late update made it
    exact (``slow_sends``); without ``grace`` the same step is wrong. The late update waits for
    ``late_interval`` from the run's start (``LateSteps``): 5 s, so the victim, which reads the step
    only after its late send, always meets the partial view first (with 0.2 s, a busy box's victim
    read the correction first, and the first view went unseen: 1 run in 3 under two busy loops)."""
    sink = make_sink(book=BookConfig(grace=0.5, late_interval=5.0))
    with _LateSecondRank(sink.http_port, grpc_port=sink.grpc_port, run="told", interval=0.05, grace=0.5) as told:
        _wait(lambda: len(told.latencies) >= 8)
    told.check(min_steps=8, within=3.0)
    stalled = [s for s in told.slow_sends if s.startswith("step 2:")]
    assert len(stalled) == 1 and "missing ['trainer_r1']" in stalled[0], told.slow_sends
    with _LateSecondRank(sink.http_port, grpc_port=sink.grpc_port, run="strict", interval=0.05) as strict:
        _wait(lambda: len(strict.latencies) >= 4)
    assert any(s.startswith("step 2:") for s in strict.wrong), strict.wrong


def _wait(condition: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert condition()
