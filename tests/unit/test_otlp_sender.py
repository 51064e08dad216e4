"""The otlp view's sender with a scripted transport (the thing under test is the buffer and its
thread): the oldest step not being sent is dropped, an attempt ends by the close deadline, what a
``partial_success`` names is counted once, and a close during a backoff ends it."""

from __future__ import annotations

import threading
import time

import pytest

from rankscope.backends.otlp.sender import Sender, UnreachableError


class Scripted:
    """A transport whose ``send`` blocks until the test lets it go, then answers as told."""

    endpoint = "http://collector:4327"
    protocol = "grpc"
    timeout = 10.0

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.timeouts: list[float] = []
        self.go = threading.Event()
        self.started = threading.Event()
        self.answer: tuple[int, str] | Exception = (0, "")

    def send(self, payload: bytes, timeout: float) -> tuple[int, str]:
        self.timeouts.append(timeout)
        self.started.set()
        self.go.wait(timeout)
        if isinstance(self.answer, Exception):
            raise self.answer
        self.sent.append(payload)
        return self.answer

    def close(self) -> None:
        self.go.set()


def test_a_full_buffer_drops_the_oldest_step_not_being_sent() -> None:
    transport = Scripted()
    sender = Sender(transport, name="t", max_buffered=3, max_backoff=1.0)  # type: ignore[arg-type]
    sender.put(b"s0", 2)
    assert transport.started.wait(5)  # s0 is being sent, and blocks
    for step in (b"s1", b"s2", b"s3", b"s4"):
        sender.put(step, 2)
    transport.go.set()
    sender.close(5.0)
    assert transport.sent == [b"s0", b"s3", b"s4"]  # s1 and s2 dropped, the one in flight kept
    assert (sender.dropped_steps, sender.dropped_points, sender.sent_points) == (2, 4, 6)


def test_an_attempt_ends_by_the_close_deadline_and_what_is_left_is_counted() -> None:
    transport = Scripted()
    transport.answer = UnreachableError("refused")
    sender = Sender(transport, name="t", max_buffered=10, max_backoff=30.0)  # type: ignore[arg-type]
    sender.put(b"s0", 3)
    assert transport.started.wait(5)
    sender.put(b"s1", 3)
    started = time.monotonic()
    sender.close(0.5)  # an attempt in flight (10 s timeout), then a backoff: both end by the deadline
    assert time.monotonic() - started < 3.0
    assert all(t <= 10.0 for t in transport.timeouts)
    assert (sender.dropped_steps, sender.dropped_points, sender.sent_points) == (2, 6, 0)


def test_a_close_during_a_backoff_ends_it() -> None:
    transport = Scripted()
    transport.answer = UnreachableError("refused")
    transport.go.set()  # every attempt answers at once: unreachable
    sender = Sender(transport, name="t", max_buffered=10, max_backoff=30.0)  # type: ignore[arg-type]
    sender.put(b"s0", 1)
    deadline = time.monotonic() + 5
    while len(transport.timeouts) < 3 and time.monotonic() < deadline:  # backoffs of 0.5, 1, 2 s...
        time.sleep(0.05)
    started = time.monotonic()
    sender.close(0.2)
    assert time.monotonic() - started < 2.0  # not the rest of a backoff of up to 30 s
    assert sender.down_since is not None and sender.dropped_steps == 1


def test_partial_success_is_counted_as_refused_and_never_past_the_steps_points() -> None:
    transport = Scripted()
    transport.go.set()
    transport.answer = (50, "too many")  # a Collector that says more than the request held
    sender = Sender(transport, name="t", max_buffered=10, max_backoff=1.0)  # type: ignore[arg-type]
    sender.put(b"s0", 4)
    sender.close(5.0)
    assert (sender.refused_points, sender.sent_points, sender.last_error) == (4, 0, "too many")


def test_one_step_of_room_is_refused() -> None:
    with pytest.raises(ValueError, match="max_buffered must be >= 2"):
        Sender(Scripted(), name="t", max_buffered=1, max_backoff=1.0)  # type: ignore[arg-type]
