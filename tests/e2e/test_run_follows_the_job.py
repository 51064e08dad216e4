"""``rankscope run`` follows what the job reports, and ``top``/``report`` find its sink unasked.

The newcomer's commands: a script that names its experiment in code (``rs.init(experiment=
"newcomer-tiny")``) under ``rankscope run --report --gantt steps.json -- torchrun ...``; while it
runs, ``rankscope top --once`` and ``rankscope report`` with no flags, from the same host. Before:
``run`` printed its own generated experiment id and only the gRPC address, ``top`` (default
``--sink http://127.0.0.1:4318``) answered "no answer", and at the end ``run`` wrote a Gantt of 0
spans and said "no report" while the report existed under ``rankscope_logs/newcomer-tiny/``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

TINY = """\
import sys, time
from pathlib import Path
import torch.distributed as dist
import rankscope as rs

dist.init_process_group("gloo")
rs.init(experiment="newcomer-tiny")
rank = dist.get_rank()
gate = Path(sys.argv[1])
for step in range(4):
    with rs.trace("train_step") as t:
        t.step("forward")
        time.sleep(0.01)
        t.step("backward")
    rs.record_metric("loss", 1.0 / (step + 1) + rank)
    rs.flush(step)
if rank == 0:
    (gate / "ready").touch()
deadline = time.monotonic() + 120
while not (gate / "go").exists() and time.monotonic() < deadline:  # meanwhile the test looks at the sink
    time.sleep(0.1)
rs.shutdown()
dist.destroy_process_group()
"""


def _env(runtime: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "OTEL_", "TORCHELASTIC_", "SLURM_"))}
    env["RANKSCOPE_RUNTIME_DIR"] = str(runtime)  # where this test's sinks announce themselves
    return env


def _cli(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rankscope.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def _wait_for(path: Path, job: subprocess.Popen[bytes], log: Path, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if job.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"no {path.name} (job exit code {job.poll()}):\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


def _connections_once_both_ranks_sent(url: str) -> dict[str, Any]:
    """The sink's connection counts (its status route), once both ranks have sent it data (or 60 s passed)."""
    deadline = time.monotonic() + 60
    while True:
        with urllib.request.urlopen(f"{url}/rankscope/v1/status", timeout=10) as answer:
            status = json.load(answer)
        runs = [r for r in status["experiment_list"] if r["id"] == "newcomer-tiny"]
        if (runs and runs[0]["processes"] == 2) or time.monotonic() > deadline:
            return {"runs": runs, **status["connections"]}
        time.sleep(0.2)


@pytest.mark.timeout(360)
def test_run_follows_the_experiment_named_in_code_and_top_and_report_find_its_sink(tmp_path: Path) -> None:
    (tmp_path / "tiny.py").write_text(TINY)
    gate, runtime = tmp_path / "gate", tmp_path / "runtime"
    gate.mkdir()
    env = _env(runtime) | {"RANKSCOPE_PROTOCOL": "grpc"}  # a setting for other endpoints: not the run's sink's
    log = tmp_path / "run.log"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd = [sys.executable, "-m", "rankscope.cli", "run", "--report", "--gantt", "steps.json", "--", *torchrun]
    with log.open("w") as err:
        job = subprocess.Popen(
            [*cmd, "tiny.py", str(gate)],
            cwd=tmp_path,
            env=env,
            stdout=err,  # the step lines and `report: PATH`, with what `rankscope run` says
            stderr=subprocess.STDOUT,
            start_new_session=True,  # killed as a group if the test fails
        )
    try:
        _wait_for(gate / "ready", job, log, 180)
        said = log.read_text()
        http = re.search(r"HTTP (http://127\.0\.0\.1:\d+)", said)
        assert http, said[-2000:]
        url = http.group(1)
        assert f"rankscope top --sink {url}\n" in said and f"rankscope report --sink {url}\n" in said, said
        # The ranks sent OTLP/HTTP to that port, whatever RANKSCOPE_PROTOCOL says: no gRPC connection
        # was ever made (one that went quiet is counted as timed out). They sent gRPC before.
        seen = _connections_once_both_ranks_sent(url)
        assert seen["runs"] and seen["runs"][0]["processes"] == 2, seen
        assert seen["grpc"]["open"] == 0 and seen["grpc"]["timed_out"] == 0, seen

        deadline = time.monotonic() + 60
        while True:  # no flags: it finds the `rankscope run` sink on this host
            top = _cli(tmp_path, env, "top", "--once")
            if "newcomer-tiny  step" in top.stdout or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        assert top.returncode == 0 and "newcomer-tiny  step" in top.stdout, top.stdout[-2000:] + top.stderr

        report = _cli(tmp_path, env, "report")
        assert report.returncode == 0, report.stderr[-2000:]
        page = tmp_path / report.stdout.strip().splitlines()[-1]  # the sink's path: absolute, or from its cwd
        assert page.is_relative_to(tmp_path / "rankscope_logs" / "newcomer-tiny") and page.is_file(), report.stdout
        run = page.parent.name

        (gate / "go").touch()
        assert job.wait(timeout=180) == 0, log.read_text()[-3000:]
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()

    said = log.read_text()
    gantt = re.search(r"experiment 'newcomer-tiny', run (\S+): Gantt of (\d+) spans, (\d+) processes", said)
    assert gantt and gantt.group(1) == run and int(gantt.group(2)) > 0 and gantt.group(3) == "2", said[-3000:]
    events = json.loads((tmp_path / "steps.json").read_text())["traceEvents"]
    names = sorted(e["args"]["name"] for e in events if e.get("name") == "process_name")
    assert names == ["trainer_r0", "trainer_r1"]
    assert f"\nreport: rankscope_logs/newcomer-tiny/{run}/report.html\n" in said
    assert "every run of 'newcomer-tiny': rankscope report rankscope_logs/newcomer-tiny/" in said
    assert "no report" not in said
    assert not list(runtime.glob("run-*.json"))  # the discovery file goes with the sink

    gone = _cli(tmp_path, env, "top", "--once")  # the sink is gone, its file too: not found again
    assert "newcomer-tiny" not in gone.stdout
