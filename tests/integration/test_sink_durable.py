"""Nothing acknowledged is lost: SIGKILL the sink at a random moment, restart it on the same ports.

Four real SDK processes (``RANK`` 0..3 of one experiment, OTLP/gRPC to a ``rankscope sink``
process with a state directory) each record 1 per step as SUM and flush 30 steps. The sink is
killed with SIGKILL at a seeded random moment and restarted on the same ports; the SDK holds its
steps while the sink is down and sends them when it answers again. Each rank also offers a
sample row per step (``rank_by`` its rank, k=1): the rows are merged across ranks like points
and must survive the kill too. The ranks run at different
paces, so at any moment the sink holds acknowledged steps that are not yet written (they wait for
the slowest rank): those live only in the write-ahead log. Every step must be in the
final view exactly once: a step merged twice would read 8, a lost one 3.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ..conftest import ROOT, free_port
from ..pipeline import start_sink

STEPS = 30
RANKS = 4

JOB = """
import os, time, rankscope as rs
pace = 0.05 * (1 + int(os.environ["RANK"]))  # rank 0 runs ahead: its steps are acknowledged, not yet written
rank = int(os.environ["RANK"])
for step in range(%d):
    rs.record_metric("ones", 1, rs.Reduce.SUM)
    rs.record_sample("ranks", {"r": rank, "s": step}, rank_by="r", k=1)
    rs.flush(step)
    time.sleep(pace)
rs.shutdown()  # waits (bounded) for every held step to be answered
print("dropped", rs.dropped_points())
"""


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.timeout(240)
@pytest.mark.parametrize("seed", [1, 2])
def test_sigkill_during_a_four_process_run_loses_and_duplicates_nothing(tmp_path: Path, seed: int) -> None:
    grpc, http = free_port(), free_port()
    out = tmp_path / "views.jsonl"
    backends = {"jsonl": {"logging_mode": "global_reduce", "path": str(out)}}
    sink = start_sink(tmp_path, "sink", backends, grpc, http, grace=60.0)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "RANK", "WORLD_SIZE"))}
    env.update(
        RANKSCOPE_ENDPOINT=f"http://127.0.0.1:{grpc}",
        RANKSCOPE_EXPERIMENT="durable",
        RANKSCOPE_SHUTDOWN_TIMEOUT="90",
        RANKSCOPE_RUN_ID="durable-1",  # ranks started apart: their job names its run, as a launcher would
        WORLD_SIZE=str(RANKS),
    )
    jobs = [
        subprocess.Popen(
            [sys.executable, "-c", JOB % STEPS],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(RANKS)
    ]
    try:
        # Kill once the first steps have landed, somewhere in the run's first seconds.
        deadline = time.monotonic() + 60
        while not _rows(out) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(random.Random(seed).uniform(0.3, 2.5))
        sink.stop(signal.SIGKILL)
        sink = start_sink(tmp_path, "sink", backends, grpc, http, grace=60.0)
        outputs = [job.communicate(timeout=150) for job in jobs]
        for job, (stdout, stderr) in zip(jobs, outputs, strict=True):
            assert job.returncode == 0, stderr[-3000:]
            assert "dropped 0" in stdout, (stdout, stderr[-3000:])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if {r["step"] for r in _rows(out) if r.get("key") == "ones"} >= set(range(STEPS)):
                break
            time.sleep(0.1)
    finally:
        for job in jobs:
            if job.poll() is None:
                job.kill()
                job.communicate()
        sink.stop()
    rows = _rows(out)
    last: dict[int, float] = {}
    writes: dict[int, int] = {}
    for row in rows:
        if row.get("key") == "ones":
            last[row["step"]] = row["value"]
            writes[row["step"]] = writes.get(row["step"], 0) + 1
    assert last == dict.fromkeys(range(STEPS), float(RANKS))
    again = {step: n for step, n in writes.items() if n > 1}  # a view writes each step once, across the kill too,
    assert len(again) <= 1 and set(again.values()) <= {2}, again  # but for the one it was writing when it died
    kept: dict[tuple[int, str], tuple[int, int]] = {}
    for row in rows:
        if row["kind"] == "sample":
            kept[(row["step"], row["side"])] = (row["row"]["r"], row["row"]["s"])
    assert kept == {(step, side): (r, step) for step in range(STEPS) for side, r in (("top", 3), ("bottom", 0))}
    missing = {r["step"]: r["value"] for r in rows if r.get("key") == "rankscope/missing_processes"}
    assert all(v == 0.0 for v in missing.values()), missing
