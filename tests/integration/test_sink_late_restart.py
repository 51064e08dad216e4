"""A sink SIGKILLed during a rank's outage still corrects every step whole when the rank's data
comes (issue 50): the steps it kept for late data are on disk beside the run's write-ahead log
(``durable.kept``), read back by the restarted sink."""

from __future__ import annotations

import http.client
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ..conftest import free_port
from ..pipeline import Process, clean_env, jsonl_rows, sink_status, start_sink, wait_http
from ..victim import step_request
from ..wandb_file import by_step, run_files

STEPS = 40
"""Far past the 16 steps a run keeps live: most are read back packed."""


def send(port: int, rank: int, step: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        body = step_request("outage", "run", rank, step).SerializeToString()
        conn.request("POST", "/v1/metrics", body=body, headers={"Content-Type": "application/x-protobuf"})
        response = conn.getresponse()
        assert response.status == 200, response.read()[:300]
        response.read()
    finally:
        conn.close()


def wait_for(what: str, check: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(0.1)


@pytest.mark.timeout(180)
def test_a_sink_killed_during_an_outage_corrects_every_step_whole_after_its_restart(tmp_path: Path) -> None:
    """Rank 1 of 2 is cut off: the sink finalizes steps 0 to 39 without it. The sink is SIGKILLed
    and restarted on its state directory; then rank 1's steps come. Each step's last JSONL row is
    its exact total, each has a ``corrected`` record, none is partial."""
    grpc, http_port = free_port(), free_port()
    views = {"jsonl": {"logging_mode": "global_reduce", "path": str(tmp_path / "views.jsonl")}}
    sink = start_sink(tmp_path, "sink", views, grpc, http_port, grace=0.5)
    try:
        for step in range(STEPS):
            send(http_port, 0, step)
        wait_for("the steps finalized", lambda: sink_status(http_port, "outage").get("last_written_step") == STEPS - 1)
        kept = sink_status(http_port, "outage")["kept_steps"]
        assert (kept["live"], kept["packed"]) == (16, STEPS - 16), kept
        sink.stop(signal.SIGKILL)
        sink = start_sink(tmp_path, "sink", views, grpc, http_port, grace=0.5)
        for step in range(STEPS):
            send(http_port, 1, step)
        wait_for("the late updates written", lambda: sink_status(http_port, "outage").get("late_points") == 2 * STEPS)
        time.sleep(2.0)  # the last late updates' interval (1 s), and their views' writes
    finally:
        sink.stop()
    last: dict[int, dict[str, float]] = {}
    corrected, partial = set(), set()
    for row in jsonl_rows(tmp_path / "views.jsonl"):
        if row.get("kind") == "global_reduce":
            last.setdefault(row["step"], {})[row["key"]] = row["value"]
        elif row.get("type") == "corrected":
            corrected.add(row["step"])
        elif row.get("type") == "partial":
            partial.add(row["step"])
    assert {s: (last[s]["loss"], last[s]["top"]) for s in range(STEPS)} == {s: (s + 0.5, s + 1.0) for s in range(STEPS)}
    assert all(last[s]["rankscope/missing_processes"] == 0 for s in range(STEPS))
    assert corrected == set(range(STEPS)) and partial == set(), (sorted(corrected), sorted(partial))
    assert (tmp_path / "sink.log").read_text().count("finalized without") == 1  # said once, at step 0


@pytest.mark.timeout(120)
def test_a_sink_keeps_its_w_and_b_runs_to_itself_whatever_service_its_parent_had(tmp_path: Path) -> None:
    """A sink started by a process that used W&B inherits ``WANDB_SERVICE``: sharing that service,
    a SIGKILLed sink's W&B run stayed open there, and the restarted sink's W&B view was off ("run
    ID is in use"). The sink runs its own service: here the inherited one does not even answer."""
    from wandb.sdk.lib.service.service_token import TCPServiceToken

    grpc, http_port = free_port(), free_port()
    gone = TCPServiceToken(parent_pid=os.getpid(), port=free_port())._as_env_string()
    command = [sys.executable, "-m", "rankscope.cli", "sink", "--grpc-port", str(grpc), "--http-port", str(http_port)]
    views = {"wandb": {"mode": "offline", "dir": str(tmp_path / "wandb"), "logging_mode": "global_reduce"}}
    command += ["--backends", json.dumps(views), "--grace", "0.5", "--state-dir", str(tmp_path / "state")]
    sink = Process(command, clean_env(WANDB_SERVICE=gone, WANDB_SILENT="true"), tmp_path / "sink.log")
    try:
        wait_http(f"http://127.0.0.1:{http_port}/healthz", proc=sink)
        for rank in (0, 1):
            send(http_port, rank, 0)
        wait_for("the step written", lambda: sink_status(http_port, "outage").get("last_written_step") == 0)
    finally:
        sink.stop()
    assert "wandb backend is off" not in sink.text(), sink.text()[-2000:]
    assert by_step(run_files(tmp_path / "wandb"))[0]["loss"] == 0.5
