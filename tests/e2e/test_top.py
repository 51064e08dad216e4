"""``rankscope top`` as a person sees it: a pseudo-terminal watching a live torchrun experiment
with a straggler, its screen text read back (issue 17); a tmux pane of 80 columns watching a plain
torchrun job with the embedded sink from before its first step to after its end."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import re
import select
import shlex
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from rankscope.sink import BookConfig

from ..conftest import ROOT
from ..pane import Pane
from ..pipeline import clean_env

WORKER = str(ROOT / "tests" / "workers" / "anomaly_worker.py")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\r")


def test_top_shows_the_experiment_its_step_advancing_and_the_straggler(make_sink, tmp_path: Path) -> None:
    sink = make_sink(auto_capture_steps=0, book=BookConfig(grace=30))
    env = clean_env(RANKSCOPE_EXPERIMENT="watched", RANKSCOPE_ENDPOINT=sink.endpoint)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4", WORKER, "straggler"]
    job = subprocess.Popen(  # its own process group: the ranks go with torchrun at the end
        [*cmd, "30"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 60, 160, 0, 0))
    top = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rankscope.cli",
            "top",
            "--sink",
            f"http://127.0.0.1:{sink.http_port}",
            "--interval",
            "0.3",
        ],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "160", "LINES": "60"},
        close_fds=True,
    )
    os.close(slave)
    screen = ""
    steps: set[int] = set()
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    screen += ANSI.sub("", os.read(master, 65536).decode(errors="replace"))
                except OSError:
                    break
            steps |= {int(s) for s in re.findall(r"watched  step (\d+)", screen)}
            if "straggler: trainer_r1" in screen and len(steps) >= 3:
                break
        assert "watched" in screen and len(steps) >= 3, screen[-3000:]  # the step advances on screen
        assert "straggler: trainer_r1 in" in screen, screen[-3000:]
        assert "seconds per phase" in screen and "trainer_r3" in screen  # the rank x phase map
        os.write(master, b"q")
        assert top.wait(timeout=10) == 0  # q quits
    finally:
        if top.poll() is None:
            top.kill()
            top.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)  # torchrun and the ranks it started, which outlive a killed agent
        job.wait()
        os.close(master)


JOB = '''"""A plain torchrun job (2 ranks, the embedded sink): the user's keys, traced phases, an all-reduce.

Rank 1 starts stepping once gates/go exists, so rank 0 closes step 0 alone and the sink waits
for rank 1 (its grace set long): no step is finalized yet. Both ranks stop at the step where
gates/stop exists (they agree over the all-reduce), and say goodbye.
"""

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import rankscope as rs

gates = Path(sys.argv[1])
dist.init_process_group("gloo")
rs.init(experiment="topjob")
rank = dist.get_rank()
(gates / f"rank{rank}.pid").write_text(str(os.getpid()))  # torchrun starts ranks in sessions of their own
for step in range(900):
    while rank == 1 and step == 0 and not (gates / "go").exists():
        time.sleep(0.05)
    stopping = False
    with rs.trace("train") as t:
        time.sleep(0.02)
        t.step("data")
        time.sleep(0.01)
        t.step("forward")
        if step:  # rank 0 closes step 0 alone
            sync = torch.tensor([1.0, float((gates / "stop").exists())])
            dist.all_reduce(sync)
            stopping = sync[1].item() > 0
        t.step("backward")
    rs.record_metric("loss", 1.0 / (step + 1))
    rs.record_metric("grad_norm", 2.0 + rank)
    rs.record_metric("validation/per_token_cross_entropy_loss_mean", 0.5 / (step + 1))
    rs.record_metric("validation/per_token_cross_entropy_loss_max", 0.9 / (step + 1))
    rs.flush(step)
    if stopping:
        break
    time.sleep(0.1)
rs.shutdown()
dist.destroy_process_group()
'''


def _keys_rows(screen: str) -> list[str]:
    """The keys table's rows: each row's key as shown."""
    lines = screen.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "keys")
    rows = []
    for line in lines[start + 4 :]:
        if not line.startswith("│"):
            break
        rows.append(line.split("│")[1].strip())
    return rows


@pytest.mark.timeout(240)
def test_top_at_80_columns_waits_for_the_first_step_follows_the_job_and_keeps_its_last_screen(
    tmp_path: Path, tmux_ready: None
) -> None:
    """A newcomer's `rankscope top` in a terminal of 80 columns, started before a plain `torchrun
    --nproc_per_node=2` job with the embedded sink: waiting (no ``None``), then the user's own keys
    first (two long ones cut in the middle, still distinct), a real step rate, and at the job's end
    ``run ended`` over the last screen, which stays on the terminal after top exits by itself."""
    gates = tmp_path / "gates"
    gates.mkdir()
    script = tmp_path / "job.py"
    script.write_text(JOB)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "OTEL_", "TMUX"))}
    base |= {"RANKSCOPE_RUNTIME_DIR": str(tmp_path / "run")}  # this test's sinks only: discovered by this top
    top = f"{shlex.quote(sys.executable)} -m rankscope.cli top --interval 0.3"
    pane = Pane({**base, "TERM": "xterm-256color", "SHELL": "/bin/sh", "LC_ALL": "C.UTF-8"}, tmp_path, top)
    job: subprocess.Popen[bytes] | None = None
    log = (tmp_path / "job.log").open("wb")
    try:
        before = pane.until(lambda s: "waiting for a sink" in s, 60, "top waiting for a sink")
        job = subprocess.Popen(  # its own process group: the ranks go with torchrun at the end
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node=2",
                str(script),
                str(gates),
            ],
            env={**base, "RANKSCOPE_SINK_GRACE": "120"},  # the sink waits for rank 1's step 0
            cwd=tmp_path,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        waiting = pane.until(  # (0 processes seen) first, between the sink's start and rank 0's first data
            lambda s: "waiting for the first step of topjob (1 process seen)" in s, 120, "the waiting state"
        )
        assert "None" not in before + waiting, before + waiting

        (gates / "go").touch()
        stepping = re.compile(r"^topjob  step (\d+)  lag \S+  (\S+) steps/s", re.M)
        during = pane.until(
            lambda s: (m := stepping.search(s)) is not None and int(m[1]) >= 12 and "│ loss" in s, 120, "steps"
        )
        found = stepping.search(during)
        # the job's pace over its last 10 steps (~7 steps/s here), not the pace at which the sink finalized them
        assert found is not None and 0.5 < float(found[2]) < 50, during
        rows = _keys_rows(during)
        assert len(rows) == 6 and len(set(rows)) == 6, during
        assert not any(row.startswith(("train/", "comm/")) for row in rows[:4]), during  # the user's keys first
        assert {"loss", "grad_norm"} <= set(rows[:4]), during
        assert all(row.startswith("train/") for row in rows[4:]), during  # then the traced phases
        cut = [row for row in rows[:4] if "…" in row]  # the two long keys, cut in the middle, still distinct
        assert len(cut) == 2 and {row.rsplit("_", 1)[1] for row in cut} == {"mean", "max"}, during
        assert "None" not in during, during

        (gates / "stop").touch()
        assert job.wait(timeout=60) == 0, (tmp_path / "job.log").read_text()[-3000:]
        after = pane.until(lambda s: "pane command exited" in s, 60, "top exiting by itself")
        assert "pane command exited 0" in after, after
        assert re.search(r"^run ended \((every process said goodbye|the sink at \S+ is gone)\)", after, re.M), after
        last = stepping.pattern.replace("  lag \\S+", "")  # no lag once the run ended
        kept = re.search(last, after, re.M)
        assert kept is not None and int(kept[1]) >= int(found[1]), after  # the last screen, left on the terminal
        assert "│ loss" in after and "None" not in after and "no answer" not in after, after
    finally:
        pane.close()
        if job is not None:
            for gate in ("go", "stop"):  # a failed test's job stops too: at its next step, else killed
                (gates / gate).touch()
            with contextlib.suppress(subprocess.TimeoutExpired):
                job.wait(timeout=20)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        for pid in gates.glob("rank*.pid"):
            with contextlib.suppress(OSError, ValueError):
                if str(script).encode() in Path(f"/proc/{int(pid.read_text())}/cmdline").read_bytes():
                    os.kill(int(pid.read_text()), signal.SIGKILL)
        log.close()
        for info in (tmp_path / "run").rglob("sink.json"):  # an embedded sink a failed test left
            with contextlib.suppress(OSError, ValueError, KeyError):
                pid = int(json.loads(info.read_text())["pid"])
                if b"rankscope.sink.embedded" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGTERM)
