"""The console a newcomer reads (issue 41): `python examples/main.py` prints a few lines a step, the
user's keys in one order, 4 significant digits, the step's time and who held it up, its straggler
said once; a torchrun job stopped with Ctrl-C ends on a step called interrupted, not judged; a tqdm
bar on the same terminal, in the process or in a rank whose steps the sink prints, is never run into."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ..conftest import ROOT
from ..pane import Pane

STEPS = 8
VALUE = re.compile(r"(?<![\w/])([A-Za-z_][\w/]*) (-?\d[\d.]*(?:e[+-]\d+)?|nan|-?inf)(?= |$)")
"""``key value`` on a console line (a process label in parentheses and the time tail are not)."""


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "OTEL_", "WANDB_"))}
    return {**env, "RANKSCOPE_RUNTIME_DIR": str(tmp_path / "run"), "COLUMNS": "120", **extra}


def by_step(out: str) -> dict[int, list[str]]:
    """Each step's lines: its ``step N`` line, the lines continuing it and its sample tables'; a
    ``step N (late update)`` in their place (a process that started past the job's start hold, as on
    a busy box: the step as it finally is)."""
    steps: dict[int, list[str]] = {}
    current: list[str] | None = None
    for line in out.splitlines():
        found = re.match(r"step (\d+)(  | \(late update\)  )", line)
        if found:
            current = steps[int(found.group(1))] = [] if found.group(2) != "  " else steps.get(int(found.group(1)), [])
            line = line.replace(" (late update)", "", 1)
        elif not line.startswith("  "):
            current = None
        if current is not None:
            current.append(line)
    return steps


def significant_digits(number: str) -> int:
    mantissa = number.lstrip("-").split("e")[0].replace(".", "").lstrip("0")
    return len(mantissa.rstrip("0")) if "." not in number.split("e")[0] else len(mantissa)


@pytest.mark.timeout(300)
def test_the_main_examples_console_reads_at_a_glance(tmp_path: Path) -> None:
    """`python examples/main.py` as the README runs it (it printed 444 lines for 8 steps: ~55
    ``key: value`` lines a step, 17 digits, the order changing, the straggler buried)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "main.py")],
        cwd=tmp_path,
        env=clean_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    steps = by_step(done.stdout)
    assert sorted(steps) == list(range(STEPS)), done.stdout
    assert all(len(lines) <= 4 for lines in steps.values()), done.stdout  # 3 wrapped at 120 columns, the table's
    late = done.stdout.count(" (late update)  ")
    assert late <= 3, done.stdout  # only the first steps, for a process that started late
    assert len(done.stdout.splitlines()) <= (STEPS + late) * 4 + 8, done.stdout

    orders = []
    for step, lines in steps.items():
        text = " ".join(line for line in lines if not line.lstrip().startswith("table "))
        shown = re.sub(r"^step \d+", "", text.split("| time")[0])
        orders.append([key for key, _ in VALUE.findall(re.sub(r" \([^)]*\)", "", shown))])
        for key, number in VALUE.findall(shown.replace("(", " ").replace(")", " ")):  # percentiles too
            if number not in ("nan", "inf", "-inf") and not re.fullmatch(r"-?\d+", number):
                assert significant_digits(number) <= 4, (step, key, number)
        assert re.search(r"\| time \d[\d.]*(s|ms|us), slowest \w+", text), text
    assert all(order == orders[0] for order in orders), orders  # one order, every step
    assert orders[0][:2] == ["generator/reward", "generator/response_tokens"] and "trainer/loss" in orders[0]
    for internal in ("rl/", "rankscope/", "straggler/", "duration", "argmax_rank"):
        assert internal not in done.stdout, internal

    alerts = re.sub(
        r"^(!!! .*)((?:\n    \S.*)+)", lambda m: m[1] + m[2].replace("\n    ", " "), done.stdout, flags=re.M
    )
    stragglers = re.findall(  # the cause, then its victims: they waited for it in the all-reduce
        r"^!!! step (\d+) straggler: trainer_r2 in train/forward(?: since step (\d+))?, \+\d[\d.]*m?s "
        r"\(\S+x the others\)(; arrived last at all_reduce, 3 others waited up to \S+)?$",
        alerts,
        re.M,
    )
    assert len(stragglers) == 1, done.stdout  # a streak, said once, when the sink names it
    # Named by its arrival at the all-reduce as a rule; on a loaded box a step whose collective
    # spans came after its judgement names it by its phase alone (the same rank, the same phase).
    named, since, _ = stragglers[0]
    assert int(since or named) in (3, 4), done.stdout  # slow from step 3, the warm-up steps before it
    held_up = [step for step in range(5, STEPS) if "slowest trainer_r2 in train/forward" in " ".join(steps[step])]
    assert held_up, done.stdout  # and each step names it as the one that held the others up
    assert "gpuGetDeviceCount" not in done.stderr and "rankscope:0:" not in done.stderr


@pytest.mark.timeout(180)
def test_a_jobs_last_step_after_ctrl_c_is_interrupted_and_not_judged(tmp_path: Path) -> None:
    """Ctrl-C on `torchrun --nproc_per_node=2 train.py`: the sink finalizes the step the job
    ended in as ``interrupted`` (it said "missing", with a straggler line from the cut phases)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    command.append(str(ROOT / "tests" / "workers" / "ctrl_c_worker.py"))
    job = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=clean_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the terminal's Ctrl-C reaches every process of it
    )
    out: list[str] = []
    err: list[str] = []
    readers = [
        threading.Thread(target=lambda: out.extend(job.stdout), daemon=True),  # type: ignore[arg-type]
        threading.Thread(target=lambda: err.extend(job.stderr), daemon=True),  # type: ignore[arg-type]
    ]
    for reader in readers:
        reader.start()

    def steps_shown() -> int:
        return sum(bool(re.match(r"(step|=== \[GlobalReduce\] - METRICS STEP) \d", line)) for line in out)

    try:
        deadline = time.monotonic() + 120
        while steps_shown() < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert steps_shown() >= 3, "".join(out + err)[-3000:]
        time.sleep(0.45)  # into a step
        os.killpg(job.pid, signal.SIGINT)  # the terminal's Ctrl-C: torchrun passes it on to its ranks
        job.wait(timeout=60)
        for reader in readers:  # the embedded sink writes on the same pipes until it has finalized
            reader.join(timeout=60)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGINT)
            try:
                job.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, signal.SIGKILL)
        for pid in re.findall(r"^rank \d pid (\d+) stepping", "".join(out), re.M):  # never leave a rank behind
            _end(int(pid), "ctrl_c_worker.py", signal.SIGKILL)
        _stop_the_sink(tmp_path)
        for pipe in (job.stdout, job.stderr):
            if pipe is not None:
                pipe.close()
    text = "".join(out)
    interrupted = re.findall(r"^!!! step (\d+) interrupted: the job ended before every process closed it", text, re.M)
    assert len(interrupted) >= 1, text[-3000:] + "".join(err)[-3000:]
    for step in interrupted:
        assert not re.search(rf"^!!! step {step} (straggler|missing|slow step|non-finite)", text, re.M), text[-3000:]
        assert f"step {step} finalized without" not in "".join(err)
        for line in text.splitlines():  # its phases were cut short: no time, nobody held it up
            assert not (line.startswith(f"step {step}  ") and "| time" in line), line


BARRED = """\
import os, sys, time
from tqdm import tqdm
import rankscope as rs
if len(sys.argv) > 1:
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
rank = int(os.environ.get("RANK", "0"))
for step in tqdm(range(10), disable=rank != 0, mininterval=0):
    rs.record_metric("loss", 1.0 / (step + 1))
    time.sleep(0.2)
    if len(sys.argv) > 1:
        dist.all_reduce(torch.ones(4))
    rs.flush(step)
"""
RUN_INTO = re.compile(r"(it/s|s/it)\]\S")
"""A tqdm bar's rate, then text on the same line: something printed into the bar."""


@pytest.mark.timeout(240)
@pytest.mark.parametrize("launch", ["python", "torchrun"])
def test_a_tqdm_bar_on_the_terminal_is_never_run_into_by_the_steps_lines(
    tmp_path: Path, tmux_ready: None, launch: str
) -> None:
    """A tqdm bar over the loop, in a real terminal (a tmux pane): rankscope's lines (where the metrics
    go, each step's, where the report is) each start a line of their own, whether this process prints
    them or, under torchrun, the job's embedded sink, which cannot call ``tqdm.write``."""
    (tmp_path / "job.py").write_text(BARRED)
    python = sys.executable
    command = f"{python} job.py" if launch == "python" else f"{python} -m torch.distributed.run --standalone "
    if launch == "torchrun":
        command += "--nproc_per_node=2 job.py dist"
    env = clean_env(tmp_path, OMP_NUM_THREADS="1", TERM="xterm-256color", SHELL="/bin/sh", LC_ALL="C.UTF-8")
    env = {k: v for k, v in env.items() if not k.startswith("TMUX") and k != "COLUMNS"}
    pane = Pane(env, tmp_path, command, width=200, height=60)
    try:
        screen = pane.until(lambda s: "pane command exited" in s, 180, "the job's end", history=True)
    finally:
        pane.close()
        _stop_the_sink(tmp_path)
    lines = screen.splitlines()
    assert "pane command exited 0" in screen, screen
    assert any("10/10 [" in line for line in lines), screen  # the bar was drawn
    assert not [line for line in lines if RUN_INTO.search(line)], screen
    for step in range(10):
        assert sum(line.startswith(f"step {step}  loss ") for line in lines) == 1, screen
    assert sum(line.startswith("rankscope: experiment job") for line in lines) == 1, screen
    assert sum(line.startswith("report: ") for line in lines) == (1 if launch == "torchrun" else 0), screen


def _stop_the_sink(tmp_path: Path) -> None:
    """The embedded sink stops once its job's processes are gone; if a failed test left it, stop it."""
    for info in (tmp_path / "run").rglob("sink.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            _end(int(json.loads(info.read_text())["pid"]), "rankscope.sink.embedded", signal.SIGTERM)


def _end(pid: int, command: str, sig: signal.Signals) -> None:
    """Signal ``pid`` if it is still the process this test started (its command line names ``command``)."""
    with contextlib.suppress(OSError):
        if command in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
            os.kill(pid, sig)
