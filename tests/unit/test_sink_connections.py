"""What aiohttp logs of the sink's connections (``sink.edge.connections.QuietLog``): a client's
malformed request is a warning without a traceback, and one kind is said once per interval."""

from __future__ import annotations

import logging

import pytest
from aiohttp.http_exceptions import BadStatusLine, InvalidHeader

from rankscope.sink.testing import QuietLog


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def test_malformed_requests_are_said_once_per_kind_and_interval_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    quiet = QuietLog(logging.getLogger("rankscope.sink.http"), interval=10.0, clock=clock)
    with caplog.at_level(logging.DEBUG, logger="rankscope.sink.http"):
        for _ in range(2000):
            quiet.exception("Error handling request from %s", "10.0.0.1", exc_info=InvalidHeader(b"Bad Header"))
        quiet.exception("Error handling request from %s", "10.0.0.2", exc_info=BadStatusLine("\x16\x03"))
        quiet.debug("Ignored premature client disconnection")  # below WARNING: as aiohttp says it
        try:
            raise RuntimeError("a bug of the sink's")
        except RuntimeError:
            quiet.exception("Unhandled exception")
        clock.now += 10.0
        quiet.exception("Error handling request from %s", "10.0.0.1", exc_info=InvalidHeader(b"Bad"))
    said = [(r.levelname, r.getMessage(), r.exc_info is not None) for r in caplog.records]
    assert said == [
        ("WARNING", "Error handling request from 10.0.0.1: 400, message: Invalid HTTP header: b'Bad Header'", False),
        ("WARNING", "Error handling request from 10.0.0.2: 400, message: Bad status line '\\x16\\x03'", False),
        ("DEBUG", "Ignored premature client disconnection", False),
        ("ERROR", "Unhandled exception", True),  # the sink's own failure keeps its traceback
        (
            "WARNING",
            "Error handling request from 10.0.0.1: 400, message: Invalid HTTP header: b'Bad' "
            "(and 1999 more like it in the last 10 s)",
            False,
        ),
    ]
