"""Step alignment end to end: a missing process and a late point through a real sink."""

from __future__ import annotations

import json
from typing import Any

from rankscope.core import names as attr
from rankscope.sink import BookConfig

from ..conftest import run_python

SDK_PROCESS = """
import os, rankscope as rs
rs.init(experiment="e2e", endpoint=os.environ["SINK"])
for step in {steps}:
    rs.record_metric("n", 1, rs.Reduce.SUM)
    rs.flush(step)
rs.shutdown()
"""


def test_missing_and_late_through_a_real_sink(make_sink, tmp_path, caplog) -> None:
    out = tmp_path / "views.jsonl"
    sink = make_sink(
        backends={"jsonl": {"logging_mode": "global_reduce", "path": str(out)}}, book=BookConfig(grace=1.0)
    )
    # rank 1 of 2 never reports; the ranks, started apart, name their job's run as a launcher would
    env = {"SINK": sink.endpoint, "RANK": "0", "WORLD_SIZE": "2", "RANKSCOPE_RUN_ID": "job-1"}
    result = run_python(SDK_PROCESS.format(steps="[0, 1]"), env)
    assert result.returncode == 0, result.stderr
    deadline_rows = _wait_rows(sink, out, lambda rows: {r["step"] for r in rows} >= {0, 1})
    missing = {r["step"]: r["value"] for r in deadline_rows if r.get("key") == attr.MISSING_PROCESSES}
    assert missing == {0: 1.0, 1: 1.0}  # named at step 0, not waited for at step 1, but still absent from it
    assert sum("trainer_r1" in r.getMessage() for r in caplog.records) == 1  # named once

    late = run_python(SDK_PROCESS.format(steps="[0]"), {**env, "RANK": "1"})  # rank 1 shows up late
    assert late.returncode == 0, late.stderr
    rows = _wait_rows(sink, out, lambda rows: any(r.get("late") for r in rows))
    (update,) = [r for r in rows if r.get("late") and r["key"] == "n"]
    assert update["step"] == 0 and update["value"] == 2.0
    assert sink.status("e2e")["late_points"] == 1


def _wait_rows(sink: Any, path: Any, done: Any, timeout: float = 20.0) -> list[dict[str, Any]]:
    import time

    deadline = time.monotonic() + timeout
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        sink.wait_written("e2e", 5)
        rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        rows = [r for r in rows if r["kind"] == "global_reduce"]  # not the anomaly records beside them
        if done(rows):
            return rows
        time.sleep(0.1)
    raise AssertionError(f"timed out; rows so far: {rows}")
