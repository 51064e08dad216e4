"""Where the report is, said after the job's last lines: rank 1 raises in step 1 while rank 0, which
started the job's embedded sink, goes on to its end. Step 1 is final at rank 0's goodbye (every
process said goodbye: ``StepBook.finished``), and rank 0 says ``report:`` once the run is over
(``lifecycle.shutdown._say_report``): on its terminal, the failed step comes first.

Two plain processes (no torch.distributed: which rank sends first, and so starts the sink, is the
test's to choose), the real embedded sink they share, the terminal read as a person reads it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

SCRIPT = """\
import os, sys, time
from pathlib import Path
import rankscope as rs
rank, here = int(os.environ["RANK"]), Path(sys.argv[1])
rs.record_metric("loss", 1.0 + rank)
rs.flush(0)
if rank == 0:
    assert rs.force_flush(60.0)  # sent: this process started the job's sink
    (here / "started").touch()
    rs.record_metric("loss", 0.5)
    rs.flush(1)
    while not (here / "rank1-exited").exists():  # rank 1 raised in step 1 and exited
        time.sleep(0.05)
    if os.environ.get("RAISE") == "1":
        raise RuntimeError("Connection closed by peer")  # as gloo's all-reduce whose peer is gone
else:
    rs.record_metric("loss", 0.25)
    raise ZeroDivisionError("division by zero")
"""


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "OTEL_", "TORCHELASTIC_"))}
    env.update(
        RANKSCOPE_EXPERIMENT="order",
        RANKSCOPE_RUN_ID="order-1",
        RANKSCOPE_RUNTIME_DIR=str(tmp_path / "runtime"),
        RANKSCOPE_SHUTDOWN_TIMEOUT="20",  # a busy box: rank 0 waits for its last step to be written
        WORLD_SIZE="2",
        OMP_NUM_THREADS="1",
    )
    return env


def _kill_sink(tmp_path: Path) -> None:
    for info in (tmp_path / "runtime").rglob("sink.json"):  # the job's sink, in a session of its own
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(json.loads(info.read_text())["pid"]), signal.SIGKILL)


@pytest.mark.timeout(180)
def test_a_failed_step_is_said_before_where_the_report_is(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = _env(tmp_path)
    command = [sys.executable, str(script), str(tmp_path)]
    rank0 = subprocess.Popen(
        command, cwd=tmp_path, env={**env, "RANK": "0"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 90
        while not (tmp_path / "started").exists() and rank0.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "started").exists(), rank0.communicate(timeout=30)
        rank1 = subprocess.run(
            command, cwd=tmp_path, env={**env, "RANK": "1"}, capture_output=True, text=True, timeout=90
        )
        assert rank1.returncode == 1 and "ZeroDivisionError" in rank1.stderr, rank1.stderr[-2000:]
        assert "report:" not in rank1.stdout  # the sink's starter says it, once
        (tmp_path / "rank1-exited").touch()
        out, err = rank0.communicate(timeout=90)  # until the sink, which prints here too, has exited
    finally:
        _kill_sink(tmp_path)
        if rank0.poll() is None:
            rank0.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            rank0.communicate(timeout=10)
    assert rank0.returncode == 0, err[-3000:]
    assert out.count("!!! step 1 failed: trainer_r1 raised ZeroDivisionError: division by zero") == 1, out
    assert out.count("\nreport: ") == 1, out
    assert out.index("!!! step 1 failed") < out.index("\nreport: "), out


@pytest.mark.timeout(180)
def test_the_starter_that_raised_and_is_stopped_by_sigterm_at_its_exit_still_says_where_the_report_is(
    tmp_path: Path,
) -> None:
    """torchrun's case: rank 0, which started the sink, raises too (its all-reduce lost its peer), and
    the launcher's SIGTERM, sent because rank 1 failed, lands while rank 0's exit shuts down. The
    stop leaves that shutdown to go on: it says where the report is (once parked, it said nothing)."""
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = _env(tmp_path)
    command = [sys.executable, str(script), str(tmp_path)]
    rank0 = subprocess.Popen(
        command,
        cwd=tmp_path,
        env={**env, "RANK": "0", "RAISE": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    said: list[str] = []
    raised = threading.Event()

    def read_stderr() -> None:  # the launcher's SIGTERM, the moment rank 0's error is printed
        assert rank0.stderr is not None
        for line in rank0.stderr:
            said.append(line)
            if line.startswith("RuntimeError: Connection closed by peer") and not raised.is_set():
                raised.set()
                with contextlib.suppress(ProcessLookupError):
                    rank0.send_signal(signal.SIGTERM)

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 90
        while not (tmp_path / "started").exists() and rank0.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "started").exists(), "".join(said)[-3000:]
        rank1 = subprocess.run(
            command, cwd=tmp_path, env={**env, "RANK": "1"}, capture_output=True, text=True, timeout=90
        )
        assert rank1.returncode == 1, rank1.stderr[-2000:]
        (tmp_path / "rank1-exited").touch()
        assert rank0.stdout is not None
        out = rank0.stdout.read()  # until the sink, which prints here too, has exited
        rank0.wait(timeout=90)
    finally:
        _kill_sink(tmp_path)
        if rank0.poll() is None:
            rank0.kill()
            rank0.wait(timeout=10)
        reader.join(timeout=10)
        for stream in (rank0.stdout, rank0.stderr):
            if stream is not None:
                stream.close()
    err = "".join(said)
    assert raised.is_set(), err[-3000:]
    assert rank0.returncode in (1, -signal.SIGTERM), err[-3000:]
    assert out.count("trainer_r1 raised ZeroDivisionError: division by zero") == 1, out
    assert out.count("\nreport: ") == 1, out + err[-3000:]
