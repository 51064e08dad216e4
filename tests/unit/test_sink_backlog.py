"""A step's grace is the clients' time: a request the sink received in time holds it (``edge.backlog``)."""

from __future__ import annotations

from rankscope.sink.testing import Backlog


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_backlog_holds_the_time_at_its_oldest_request_and_no_longer_than_its_most() -> None:
    clock = Clock()
    backlog = Backlog(clock, most=10.0)
    assert backlog.heard_until() == 100.0  # nothing held: now
    first, second = backlog.held(), backlog.held()
    with first:
        clock.now = 101.0
        with second:
            clock.now = 103.0
            assert (backlog.heard_until(), len(backlog)) == (100.0, 2)
        assert backlog.heard_until() == 100.0  # the newer one answered: the oldest still holds
        clock.now = 140.0
        assert backlog.heard_until() == 130.0  # held at most ``most`` seconds
    assert (backlog.heard_until(), len(backlog)) == (140.0, 0)


def test_a_refusal_raised_through_the_backlog_still_lets_go() -> None:
    backlog = Backlog(Clock())
    try:
        with backlog.held():
            raise ValueError("refused")
    except ValueError:
        pass
    assert len(backlog) == 0
