"""Periodic exports of a process that never flushes lose nothing that is recorded meanwhile.

The export thread used to swap the recorder's accumulators itself while the caller was
appending: a value whose accumulator the caller had fetched just before the swap was appended
after the step had been encoded, and lost. Now the caller's thread takes the step when asked.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..conftest import run_python

JOB = """
import sys, time, rankscope as rs
rs.init(experiment="periodic", backends={"jsonl": {"logging_mode": "per_rank_reduce", "path": sys.argv[1]}},
        export_interval=0.01)
deadline = time.monotonic() + 3.0
n = 0
while time.monotonic() < deadline:  # never flushes: every export is a periodic one
    for _ in range(1000):
        rs.record_metric("ones", 1, rs.Reduce.SUM)
    n += 1000
rs.shutdown()
print("recorded", n)
"""


@pytest.mark.timeout(120)
def test_values_recorded_during_periodic_exports_are_all_exported(tmp_path: Path) -> None:
    out = tmp_path / "rows.jsonl"
    result = run_python(JOB.replace("sys.argv[1]", repr(str(out))))
    assert result.returncode == 0, result.stderr[-3000:]
    recorded = int(result.stdout.split("recorded")[1])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    ones = [r for r in rows if r["key"] == "ones"]
    assert len(ones) > 5, len(ones)  # many periodic exports happened while recording (at most ~3 a second)
    assert sum(r["value"] for r in ones) == recorded


ANNOUNCED = """
import sys, time, rankscope as rs
rs.init(experiment="announced", backends={"jsonl": {"logging_mode": "per_rank_reduce", "path": sys.argv[1]}},
        export_interval=0.5)
time.sleep(0.7)  # idle after init (rank 0 starting the job's sink): the export thread has asked for a periodic step
rs.set_step(1)  # as torchtitan's step follower does before its first flush
rs.record_metric("tokens", 32, rs.Reduce.SUM)  # the ask, served here, took it without its step
time.sleep(1.2)  # a first step longer than the export interval (a model built on a busy box)
rs.record_metric("tokens", 32, rs.Reduce.SUM)
rs.flush(1)
rs.shutdown()
"""


@pytest.mark.timeout(120)
def test_a_process_that_announced_its_step_keeps_its_values_for_that_steps_flush(tmp_path: Path) -> None:
    """A periodic export took the first values of a ``set_step`` step without its number; a sink
    placed them by time, in the next step (torchtitan's rank 0 under load: 128 tokens in a step of
    96). A step announced is one the program will flush: nothing goes out before it."""
    out = tmp_path / "rows.jsonl"
    result = run_python(ANNOUNCED.replace("sys.argv[1]", repr(str(out))))
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["step"], r["value"]) for r in rows if r["key"] == "tokens"] == [(1, 64.0)], rows
