"""SIGTERM (what torchrun sends the other ranks once one failed, and Slurm and Kubernetes send to
stop a job): the steps a process flushed reach the sink with its goodbye, and it still dies of the
signal (-15, what its launcher expects). A real sink, a real child process, the real signal."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rankscope.sink import BookConfig, Sink

from ..pipeline import clean_env

CHILD = """
import os, signal, sys, time
import rankscope as rs

for step in range(5):
    rs.record_metric("loss", float(step))
    rs.flush(step)
# A forked child (a DataLoader worker) inherits the handler and dies of the signal at once.
pid = os.fork()
if pid == 0:
    time.sleep(60)
    os._exit(0)
started = time.monotonic()
os.kill(pid, signal.SIGTERM)
_, status = os.waitpid(pid, 0)
print(f"child {os.WTERMSIG(status) if os.WIFSIGNALED(status) else 'exited'} {time.monotonic() - started:.2f}", flush=True)
os.kill(os.getpid(), signal.SIGTERM)  # at once after the last flush: step 4 is still in the export queue
time.sleep(60)
"""


@pytest.mark.timeout(60)
def test_a_terminated_process_sends_what_it_flushed_and_its_goodbye_then_dies_of_the_signal(
    make_sink: Callable[..., Sink], tmp_path: Path
) -> None:
    views = {"jsonl": {"logging_mode": "global_reduce", "path": str(tmp_path / "{experiment}.jsonl")}}
    sink = make_sink(backends=views, book=BookConfig(grace=30))
    env = clean_env(RANKSCOPE_EXPERIMENT="termed", RANKSCOPE_ENDPOINT=sink.endpoint)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=30)
    took = time.monotonic() - started
    assert done.returncode == -signal.SIGTERM, done.stderr[-3000:]
    child = done.stdout.split()
    assert child[:2] == ["child", str(int(signal.SIGTERM))] and float(child[2]) < 2.0, done.stdout
    assert "internal error" not in done.stderr, done.stderr[-3000:]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and ((sink.status("termed") or {}).get("last_written_step") or -1) < 4:
        time.sleep(0.05)
    status = sink.status("termed") or {}
    # Every flushed step, written at once: its goodbye said nobody else is coming (no 30 s grace).
    assert status.get("last_written_step") == 4, status
    rows = [json.loads(line) for line in (tmp_path / "termed.jsonl").read_text().splitlines()]
    assert {r["step"]: r["value"] for r in rows if r["key"] == "loss"} == {s: float(s) for s in range(5)}
    assert status["runs"][0]["ended"] is True, status["runs"]
    print(f"terminated: died {took:.1f}s after its start")
