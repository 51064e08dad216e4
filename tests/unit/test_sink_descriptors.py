"""The sink's descriptor budget alone (``sink.durable.descriptors``): the split of the limit, the
least recently used holders letting go, and running out said now and then, not per attempt."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import pytest

from rankscope.sink.testing import RETAKEN, SPARE, Descriptors, Plan, WriteAheadLog, out_of_descriptors


class Holder:
    def __init__(self, name: str, busy: bool = False) -> None:
        self.name, self.busy, self.released = name, busy, 0

    def release(self) -> bool:
        if self.busy:
            return False
        self.released += 1
        return True

    def __repr__(self) -> str:
        return self.name


def test_the_plan_fits_connections_runs_and_headroom_in_the_limit() -> None:
    low = Plan.of(1024, 10)
    assert low.connections == (1024 - low.reserved) // 4 < 1024
    assert low.reserved + 2 * low.connections + low.runs == 1024 and low.runs > 300
    high = Plan.of(20_000, 10)
    assert high.connections == 1024 and high.runs > 12_288  # a full sink's 4,096 runs, three each, fit
    assert Plan.of(1024, 10, max_connections=100).connections == 100  # set by hand: as given
    assert Plan.of(150, 10).short and not low.short  # the sink says so at start
    assert low.reserved >= SPARE


def test_the_least_recently_used_let_go_and_one_in_use_is_passed_over() -> None:
    budget = Descriptors(Plan(limit=100, reserved=0, connections=0, runs=4))
    a, b, c, busy = Holder("a"), Holder("b"), Holder("c"), Holder("busy", busy=True)
    assert budget.hold(busy, 1) and budget.hold(a, 1) and budget.hold(b, 2)
    assert budget.hold(a, 1)  # used again: the most recent now
    assert budget.hold(c, 2)  # room: b goes (busy is older, but in use)
    assert (a.released, b.released, busy.released) == (0, 1, 0)
    assert budget.used == 4 and budget.holds(b) == 0 and budget.holds(c) == 2
    busy.busy = False
    assert budget.let_go(busy) and budget.used == 3  # quiet: let go by itself
    assert not budget.let_go(busy)  # holds nothing now


def test_when_every_holder_is_in_use_a_newcomer_is_refused_and_a_view_opens_anyway() -> None:
    budget = Descriptors(Plan(limit=100, reserved=0, connections=0, runs=2))
    a, b = Holder("a", busy=True), Holder("b", busy=True)
    assert budget.hold(a, 2)
    assert not budget.hold(b, 1) and budget.refused == 1
    assert budget.hold(b, 1, refusable=False) and budget.used == 3  # its views, for steps it took
    assert budget.hold(a, 3)  # one holding already may grow
    budget.forget(a)
    budget.forget(b)
    assert budget.used == 0 and budget.status()["runs_holding"] == 0


def test_a_hold_waits_for_holders_another_thread_asked_to_let_go() -> None:
    """A flood of new runs from eight clients can find the oldest holders all leaving (asked by
    another thread's ``hold``): it was refused, though their room was coming; it waits for them."""
    budget = Descriptors(Plan(limit=100, reserved=0, connections=0, runs=1))
    releasing, go = threading.Event(), threading.Event()

    class Slow(Holder):
        def release(self) -> bool:
            releasing.set()
            go.wait(5)  # a view finishing its last write
            return super().release()

    old, first, second = Slow("old"), Holder("first"), Holder("second")
    assert budget.hold(old, 1)
    got: list[bool] = []
    taker = threading.Thread(target=lambda: got.append(budget.hold(first, 1)))
    taker.start()
    assert releasing.wait(5)  # "old" is leaving for the taker
    threading.Timer(0.2, go.set).start()
    assert budget.hold(second, 1)  # waited for "old" to go (then the later of the two made the other let go)
    taker.join(5)
    assert got == [True] and budget.refused == 0 and old.released == 1
    assert budget.used == 1 and budget.holds(first) + budget.holds(second) == 1


def test_room_another_hold_took_meanwhile_is_asked_for_again_not_refused() -> None:
    """A flood from eight clients: the room one ``hold``'s victims made can go to another thread's
    ``hold`` before it looks again (CI refused 2 of 3,000 requests so). Rounds that made room do
    not use up its tries: it asks the next least recent until it fits."""
    budget = Descriptors(Plan(limit=100, reserved=0, connections=0, runs=3))
    thieves: list[Holder] = []

    class Robbed(Holder):
        def release(self) -> bool:
            budget.forget(self)  # a view's finish says so itself, then another thread's hold takes the room
            thieves.append(Holder(f"thief{len(thieves)}"))
            assert budget.hold(thieves[-1], 1)
            return super().release()

    robbed = [Robbed(f"r{i}") for i in range(3)]
    for holder in robbed:
        assert budget.hold(holder, 1)
    newcomer = Holder("newcomer")
    assert budget.hold(newcomer, 1) and budget.refused == 0  # the old code gave up after three rounds
    assert [h.released for h in robbed] == [1, 1, 1] and thieves[0].released == 1
    assert budget.used == 3 and budget.holds(newcomer) == 1


def test_room_taken_again_every_time_bounds_what_one_hold_evicts() -> None:
    """Every room made goes to another hold: the hold gives up after its three tries and ``RETAKEN``
    more, refused, not evicting holder after holder for the whole ``LEAVING_WAIT``."""
    budget = Descriptors(Plan(limit=100, reserved=0, connections=0, runs=16))
    evicted: list[str] = []

    class Robbed(Holder):
        def release(self) -> bool:
            evicted.append(self.name)
            budget.forget(self)
            assert budget.hold(Robbed(f"thief{len(evicted)}"), 1)  # the room goes at once, to one robbed in turn
            return super().release()

    for i in range(16):
        assert budget.hold(Robbed(f"r{i}"), 1)
    assert not budget.hold(Holder("newcomer"), 1) and budget.refused == 1
    assert len(evicted) == 3 + RETAKEN, evicted


def test_a_release_that_raises_leaves_the_victims_after_it_free_to_go() -> None:
    """The victims a round had not asked yet when one raised are not left "leaving": a later
    ``let_go`` (it went quiet) or another hold still asks them."""
    budget = Descriptors(Plan(limit=100, reserved=0, connections=0, runs=2))

    class Raising(Holder):
        def release(self) -> bool:
            raise OSError(5, "I/O error closing its segment")

    raising, after = Raising("raising"), Holder("after")
    assert budget.hold(raising, 1) and budget.hold(after, 1)
    with pytest.raises(OSError):
        budget.hold(Holder("big"), 2)  # asks both: the first raises
    assert budget.let_go(after) and after.released == 1 and budget.holds(after) == 0


def test_when_every_holder_stays_in_use_a_hold_gives_up_at_once() -> None:
    """Rounds whose victims all said no still count: a newcomer is refused after three, not made
    to wait out ``LEAVING_WAIT`` holding a transport's thread."""
    budget = Descriptors(Plan(limit=100, reserved=0, connections=0, runs=40))
    asked: list[str] = []

    class Busy(Holder):
        def release(self) -> bool:
            asked.append(self.name)
            return False

    for i in range(40):
        assert budget.hold(Busy(f"busy{i}"), 1)
    assert not budget.hold(Holder("newcomer"), 1) and budget.refused == 1
    assert asked == ["busy0", "busy1", "busy2"]  # one round each, then no more


def test_a_holder_whose_release_raised_is_asked_again_not_waited_for() -> None:
    budget = Descriptors(Plan(limit=100, reserved=0, connections=0, runs=1))

    class Flaky(Holder):
        def release(self) -> bool:
            if not self.released:
                self.released = -1
                raise OSError(5, "I/O error closing its segment")
            return super().release()

    flaky, a, b = Flaky("flaky"), Holder("a"), Holder("b")
    assert budget.hold(flaky, 1)
    with pytest.raises(OSError):
        budget.hold(a, 1)  # the caller's request sees it (the sink counts it as the run's error)
    assert budget.hold(b, 1) and budget.holds(flaky) == 0  # asked again; once stuck "leaving": b waited, refused


def test_running_out_is_counted_every_time_and_said_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    budget = Descriptors(Plan.of(1024, 10), clock=lambda: now[0])
    error = OSError(24, "Too many open files")
    assert out_of_descriptors(error) and not out_of_descriptors(OSError(28, "No space left"))
    with caplog.at_level(logging.ERROR, logger="rankscope.sink"):
        for _ in range(1000):
            budget.exhausted("accept", error)
        now[0] = 11.0
        budget.exhausted("open", error)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "999 more since the last report" in lines[1]
    assert budget.status()["exhausted"] == {"accept": 1000, "open": 1}
    assert "Traceback" not in caplog.text


def test_a_released_log_holds_no_descriptor_and_appends_to_the_same_segment(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path)
    log = wal.open("exp", "run")
    before = len(os.listdir("/proc/self/fd"))
    log.append(0, b"first")
    assert len(os.listdir("/proc/self/fd")) == before + 1
    assert not log.release()  # not synced yet: kept
    log.sync()
    assert log.release() and len(os.listdir("/proc/self/fd")) == before
    log.written_view(0, 1, 0, 0)  # the journal is opened per line: nothing held
    assert len(os.listdir("/proc/self/fd")) == before
    log.append(1, b"second")
    assert [p.name for p in log.directory.glob("seg-*.log")] == ["seg-0000000000000001.log"]
    log.sync()
    log.close()
    wal.close()
    reopened = WriteAheadLog(tmp_path)
    again = reopened.open("exp", "run")
    assert [(seq, step, payload) for seq, step, payload in again.replay()] == [(2, 1, b"second")]
    again.close()
    reopened.close()
