"""``rankscope top`` as a person sees it: a pseudo-terminal watching a live torchrun experiment
with a straggler, its screen text read back (issue 17)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

from rankscope.sink import BookConfig

from ..conftest import ROOT
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
