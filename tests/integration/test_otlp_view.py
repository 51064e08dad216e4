"""The ``otlp`` view when its Collector never answers (issue 54): the sink and its other views go
on, the view holds at most ``max_buffered`` steps and drops the oldest, counted in the status
route; its trouble is said once, and what it still held at the end is counted and said. A real
sink on loopback, a real job process, a port where nothing listens.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rankscope.sink import BookConfig, Sink

from ..conftest import free_port, run_python

JOB = """
import rankscope as rs

rs.init(experiment="no-collector", role="trainer")  # endpoint: RANKSCOPE_ENDPOINT
for step in range(STEPS):
    rs.record_metric("loss", 1.0 / (step + 1))
    rs.flush(step)
rs.shutdown()
"""
STEPS = 10


@pytest.mark.timeout(120)
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_collector_that_never_answers_costs_the_other_views_nothing(
    protocol: str, make_sink: Callable[..., Sink], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    otlp = {"endpoint": f"http://127.0.0.1:{free_port()}", "protocol": protocol, "max_buffered": 4}
    views = {"jsonl": {"path": str(tmp_path / "g.jsonl")}, "otlp": {**otlp, "finish_timeout": 1.0}}
    sink = make_sink(backends=views, book=BookConfig(grace=0.5))
    with caplog.at_level(logging.WARNING, logger="rankscope"):
        result = run_python(JOB.replace("STEPS", str(STEPS)), {"RANKSCOPE_ENDPOINT": sink.endpoint})
        assert result.returncode == 0, result.stderr[-3000:]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # every step written, and the view has tried to send
            status = sink.status("no-collector")
            if status is not None and status["last_written_step"] == STEPS - 1:
                health = status["views"]["otlp"]["health"]
                if health["down_since"] is not None and health["dropped_steps"] == STEPS - 4:
                    break
            time.sleep(0.1)
        assert status is not None and status["last_written_step"] == STEPS - 1, status
        health = status["views"]["otlp"]["health"]
        assert health["buffered_steps"] == 4 and health["sent_points"] == 0, health
        assert health["dropped_steps"] == STEPS - 4 and health["dropped_points"] >= 2 * (STEPS - 4), health
        assert health["down_since"] is not None and health["last_error"], health
        started = time.monotonic()
        sink.stop()
        took = time.monotonic() - started
    rows = [json.loads(line) for line in (tmp_path / "g.jsonl").read_text().splitlines()]
    assert sorted(r["step"] for r in rows if r["key"] == "loss") == list(range(STEPS))  # the other view: whole
    said = [r.getMessage() for r in caplog.records if "otlp view" in r.getMessage()]
    assert sum("does not answer" in m for m in said) == 1, said
    assert sum("drops values: its buffer of 4 steps is full" in m for m in said) == 1, said
    assert any("dropped 4 steps" in m and "before it closed" in m for m in said), said  # the 4 steps held
    assert took < 10, took  # finish_timeout bounds the view's drain: the sink stops
