"""Points a sink takes in part are never lost silently on the job's side.

A sink answers what it refuses with OTLP ``partial_success`` (a run refused because its disk is
under the floor, a quota, a scope). The job's processes read that answer: each kind of reason is
said once on stderr, and the refused points are counted by ``rs.dropped_points()``. The sink logs
each kind of refusal once. Before, a job against a sink under its disk floor ran to exit 0 with
nothing written, nothing said and ``dropped_points() == 0``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from rankscope.sink import DiskLimits, Sink

from ..conftest import run_python

JOB = """
import rankscope as rs

rs.init(experiment="full-disk", role="trainer")  # endpoint: RANKSCOPE_ENDPOINT
for step in range(STEPS):
    rs.record_metric("loss", 1.0 / (step + 1))
    rs.record_metric("tokens", 100, rs.Reduce.SUM)
    rs.flush(step)
rs.shutdown()
print(f"dropped={rs.dropped_points()}")
"""
STEPS = 6


@pytest.mark.timeout(120)
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_sink_under_its_disk_floor_is_said_once_and_counted_as_dropped(
    protocol: str, make_sink: Callable[..., Sink], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sink = make_sink(
        backends={"jsonl": {"path": str(tmp_path / "m.jsonl")}},
        disk=DiskLimits(min_free_bytes=1 << 60, where=tmp_path),  # no disk has an exabyte free
    )
    port = sink.grpc_port if protocol == "grpc" else sink.http_port
    env = {"RANKSCOPE_ENDPOINT": f"http://127.0.0.1:{port}", "RANKSCOPE_PROTOCOL": protocol}
    with caplog.at_level(logging.WARNING, logger="rankscope.sink"):
        result = run_python(JOB.replace("STEPS", str(STEPS)), env)
    assert result.returncode == 0, result.stderr[-3000:]
    said = [line for line in result.stderr.splitlines() if "refuses" in line]
    assert len(said) == 1, result.stderr[-3000:]  # six steps refused alike: one line
    assert "refuses what this process sends: the sink's disk has" in said[0] and "under its floor" in said[0], said
    assert "counted as dropped" in said[0], said
    dropped = int(result.stdout.split("dropped=")[-1])
    refused = sink.overview()["refused_points"]  # spans too
    assert 2 * STEPS <= dropped < refused, (dropped, refused)  # every recorded point counted by the job
    assert not (tmp_path / "m.jsonl").exists()
    logged = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(logged) == 1 and "under its floor" in logged[0], logged
