"""The first hour, as a newcomer meets it (issue 53): one's own 2-rank ``torchrun`` script with
nothing configured, then the hint's configuration followed literally, then ``rankscope run``
without flags; a misspelled backend, a rank that raises, a dead endpoint, a misspelled variable.

Each is the real command in a fresh directory: torchrun's ranks (gloo), the embedded sink they
start, the files they leave, and what a person reads on the terminal."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..conftest import ROOT
from ..pipeline import console_step_times

SCRIPT = ROOT / "examples" / "mytrain.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "OTEL_", "TORCHELASTIC_", "WANDB_"))}
    env.update(RANKSCOPE_RUNTIME_DIR=str(tmp_path / "runtime"), OMP_NUM_THREADS="1", WANDB_MODE="offline")
    env.update(extra)
    return env


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _report(out: str) -> Path:
    found = re.findall(r"^report: (\S+)", out, re.M)
    assert len(found) == 1, out[-3000:]  # said once, by one process
    return Path(found[0])


@pytest.mark.timeout(600)
def test_every_run_is_kept_the_hint_adds_and_the_runs_compare(tmp_path: Path) -> None:
    # 1. Plain torchrun, nothing configured: the embedded sink prints the steps and keeps the run.
    plain = _run([*TORCHRUN, str(SCRIPT), "--steps", "4"], tmp_path, _env(tmp_path))
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert re.search(r"^step 3  loss [0-9.]+  samples 128", plain.stdout, re.M), plain.stdout[-2000:]
    first = _report(plain.stdout)
    run_dir = tmp_path / first.parent
    assert first.parts[:2] == ("rankscope_logs", "mytrain") and (tmp_path / first).is_file()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert {r["step"] for r in rows if r.get("key") == "loss"} == {0, 1, 2, 3}, rows[:5]
    assert [r["value"] for r in rows if r.get("key") == "samples"] == [128.0] * 4  # the exact SUM of both ranks

    # 2. The hint, followed literally: its views add to the console and to what is kept.
    hint = re.search(r"RANKSCOPE_BACKENDS='([^']+)'", plain.stderr)
    assert hint, plain.stderr[-2000:]
    assert "keeps the run in rankscope_logs/mytrain/" in plain.stderr
    hinted = _run([*TORCHRUN, str(SCRIPT), "--steps", "4"], tmp_path, _env(tmp_path, RANKSCOPE_BACKENDS=hint.group(1)))
    assert hinted.returncode == 0, hinted.stderr[-3000:]
    # The console stays, in the same (global) format as the default's: no per-rank lines.
    assert re.search(r"^step 3  loss [0-9.]+  samples 128", hinted.stdout, re.M), hinted.stdout[-2000:]
    assert "[trainer_r" not in hinted.stdout
    second = _report(hinted.stdout)
    assert second.parent != first.parent and (tmp_path / second).is_file()
    assert list((tmp_path / "wandb").glob("offline-run-*")), "the hint's W&B view wrote nothing"

    # 3. `rankscope run` without flags keeps its run too, and says where.
    ran = _run(
        [sys.executable, "-m", "rankscope.cli", "run", "--", *TORCHRUN, str(SCRIPT), "--steps", "3"],
        tmp_path,
        _env(tmp_path),
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    third = _report(ran.stdout)
    assert third.parts[:2] == ("rankscope_logs", "mytrain") and (tmp_path / third.parent / "metrics.jsonl").is_file()

    # The experiment's runs, compared on one page.
    compared = _run(
        [sys.executable, "-m", "rankscope.cli", "report", "rankscope_logs/mytrain/"], tmp_path, _env(tmp_path)
    )
    assert compared.returncode == 0 and "3 runs of" in compared.stderr, compared.stderr


@pytest.mark.timeout(240)
def test_a_misspelled_backend_fails_fast_on_every_rank(tmp_path: Path) -> None:
    started = time.monotonic()
    done = _run([*TORCHRUN, str(SCRIPT)], tmp_path, _env(tmp_path, RANKSCOPE_BACKENDS='{"consle": {}}'))
    took = time.monotonic() - started
    assert done.returncode != 0, done.stdout[-2000:]
    said = re.findall(r"ValueError: view 'consle': unknown backend 'consle'; known backends: console, ", done.stderr)
    assert len(said) == 2, done.stderr[-4000:]  # every rank, the same message as in one process
    assert "internal error" not in done.stderr + done.stdout
    assert not (tmp_path / "rankscope_logs").exists()  # no step ran
    print(f"misspelled backend: torchrun failed after {took:.1f}s")


def test_one_process_refuses_the_misspelled_backend_the_same_way(tmp_path: Path) -> None:
    code = "import rankscope as rs\nrs.init(backends={'consle': {}})"
    done = _run([sys.executable, "-c", code], tmp_path, _env(tmp_path))
    assert "ValueError: view 'consle': unknown backend 'consle'; known backends: console, " in done.stderr


CRASH = """\
import time
import torch, torch.distributed as dist
import rankscope as rs
dist.init_process_group("gloo")
rank = dist.get_rank()
for step in range(6):
    rs.record_metric("loss", 1.0 / (step + 1))
    if rank == 1 and step == 3:
        raise ZeroDivisionError("division by zero")
    if rank == 0 and step == 3 and {elsewhere}:
        time.sleep(60)  # not in a collective: torchrun's SIGTERM ends it, nothing said
    dist.all_reduce(torch.ones(4))
    rs.flush(step)
"""


def _losses(tmp_path: Path) -> dict[int, float]:
    (kept,) = (tmp_path / "rankscope_logs" / "crash").glob("*/metrics.jsonl")
    rows = [json.loads(line) for line in kept.read_text().splitlines()]
    return {r["step"]: r["value"] for r in rows if r.get("key") == "loss" and r["kind"] == "global_reduce"}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("elsewhere", [False, True], ids=["all_reduce", "sigterm"])
def test_a_rank_that_raised_is_named_with_its_error_not_as_interrupted(tmp_path: Path, elsewhere: bool) -> None:
    (tmp_path / "crash.py").write_text(CRASH.format(elsewhere=elsewhere))
    done = _run([*TORCHRUN, "crash.py"], tmp_path, _env(tmp_path))
    assert done.returncode != 0
    said = done.stdout + done.stderr
    failed = re.findall(r"^rankscope sink: (trainer_r\d) of experiment 'crash' run '[^']+' failed: (.*)$", said, re.M)
    assert ("trainer_r1", "ZeroDivisionError: division by zero") in failed, said[-4000:]
    assert "interrupted: the job ended" not in said
    # The step the job ended in names the cause first. Rank 0 then either fails (its all-reduce lost
    # its peer) or is stopped by torchrun's SIGTERM first (asleep, or the race to it): it says
    # goodbye then, without an error of its own (``lifecycle.stopping``).
    ended_in = re.search(r"step 3 failed: (trainer_r\d) raised (\w+)[^;]*; trainer_r0 (\w+)", said)
    assert ended_in is not None, said[-4000:]
    assert ended_in.groups()[:2] == ("trainer_r1", "ZeroDivisionError"), said[-4000:]
    assert ended_in.group(3) in (("had",) if elsewhere else ("raised", "had")), said[-4000:]
    # What each rank recorded after its last flush is step 3's, never a step it had closed.
    assert _losses(tmp_path) == {0: 1.0, 1: 0.5, 2: 1 / 3, 3: 0.25}
    # Both said once (the order: ``tests/integration/test_report_line_order.py``).
    out = done.stdout
    assert out.count("!!! step 3 failed") == 1 and out.count("\nreport: ") == 1, out[-3000:]


@pytest.mark.timeout(240)
def test_a_dead_endpoint_is_said_once_per_node_and_each_loss_names_its_rank(tmp_path: Path) -> None:
    env = _env(tmp_path, RANKSCOPE_ENDPOINT="127.0.0.1:9", RANKSCOPE_CONSOL="off", RANKSCOPE_SHUTDOWN_TIMEOUT="1")
    done = _run([*TORCHRUN, str(SCRIPT), "--steps", "3"], tmp_path, env)
    assert done.returncode == 0, done.stderr[-3000:]
    down = [line for line in done.stderr.splitlines() if "does not take exports (" in line]
    assert len(down) == 1 and down[0].startswith("rankscope [trainer_r0]: http://127.0.0.1:9"), done.stderr[-3000:]
    assert len(down[0]) < 200, down[0]
    dropped = re.findall(r"rankscope \[(trainer_r\d)\]: (\d+) metric points were dropped at shutdown", done.stderr)
    assert sorted(who for who, _ in dropped) == ["trainer_r0", "trainer_r1"], done.stderr[-3000:]
    # The misspelled variable is said once (rank 0), with the name it was meant to be.
    unknown = re.findall(r"ignored: RANKSCOPE_CONSOL \(did you mean RANKSCOPE_CONSOLE\?\)", done.stderr)
    assert len(unknown) == 1, done.stderr[-3000:]


def test_recording_before_init_names_the_experiment_init_names(tmp_path: Path) -> None:
    code = (
        "import rankscope as rs\n"
        "rs.record_metric('loss', 1.0)\n"  # auto-init: the experiment would be the script's name
        "rs.init(experiment='named-later')\n"
        "rs.flush(0)\n"
    )
    (tmp_path / "early.py").write_text(code)
    done = _run([sys.executable, "early.py"], tmp_path, _env(tmp_path))
    assert done.returncode == 0, done.stderr
    notices = [line for line in done.stderr.splitlines() if "metrics ->" in line]
    assert len(notices) == 1 and "experiment named-later" in notices[0], done.stderr
    assert "step 0  loss 1" in done.stdout


def test_the_embedded_sink_with_its_console_off_is_said_so_not_promised_lines(tmp_path: Path) -> None:
    code = "import rankscope as rs\nfor step in range(2):\n    rs.record_metric('loss', 1.0)\n    rs.flush(step)\n"
    (tmp_path / "quiet.py").write_text(code)
    env = _env(tmp_path, RANKSCOPE_SINK="embedded", RANKSCOPE_CONSOLE="off")
    done = _run([sys.executable, "quiet.py"], tmp_path, env)
    assert done.returncode == 0, done.stderr[-3000:]
    notices = [line for line in done.stderr.splitlines() if "metrics ->" in line]
    assert len(notices) == 1 and "embedded sink on this machine (its console off)" in notices[0], done.stderr
    assert "prints one line per step" not in notices[0] and "step 0" not in done.stdout


SLOW_FIRST_STEP = """
import time
import torch.distributed as dist
import rankscope as rs

dist.init_process_group("gloo")
rs.init(role="trainer")
for step in range(3):
    rs.record_metric("early", 1.0, rs.Reduce.SUM)  # before the first flush: exported without a step
    with rs.trace("train") as t:
        time.sleep(4.0 if step == 0 else 0.2)  # a first step's CUDA start, compile, warm-up
        t.step("compute")
    rs.record_metric("late", 1.0, rs.Reduce.SUM)
    rs.flush(step)
rs.shutdown()
dist.destroy_process_group()
"""


@pytest.mark.timeout(300)
def test_a_first_step_of_four_seconds_is_whole_in_the_kept_run(tmp_path: Path) -> None:
    """Until its first flush a rank exports what it recorded every second without a step (it may
    be one that never flushes); the sink's time buckets then held part of step 0, and dropped it
    when the first flush came: step 0 lacked ``early``. The first step takes the buckets over."""
    (tmp_path / "slow_first.py").write_text(SLOW_FIRST_STEP)
    done = _run([*TORCHRUN, "slow_first.py"], tmp_path, _env(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = tmp_path / _report(done.stdout).parent
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rewinds = [i for i, r in enumerate(rows) if r.get("kind") == "rewind"]
    final = rows[rewinds[-1] + 1 :] if rewinds else rows  # a rewind: the steps from it come again
    step0 = {r["key"]: r["value"] for r in final if r.get("step") == 0 and "key" in r}
    assert step0.get("early") == 2.0 and step0.get("late") == 2.0, step0
    assert step0["train/compute/duration_avg_s"] >= 3.9, step0
    assert {r["key"]: r["value"] for r in final if r.get("step") == 2 and r.get("key") in ("early", "late")} == {
        "early": 2.0,
        "late": 2.0,
    }


SETUP_THEN_STEPS = """
import time
import torch.distributed as dist
import rankscope as rs

dist.init_process_group("gloo")
rs.init(role="trainer")
rs.record_metric("params", 1.0, rs.Reduce.SUM)  # set-up's own value: exported meanwhile, without a step
time.sleep(3.0)  # building the model, loading the data
for step in range(3):
    rs.record_metric("loss", 1.0 / (step + 1))
    time.sleep(0.2)
    rs.flush(step)
rs.shutdown()
dist.destroy_process_group()
"""


@pytest.mark.timeout(240)
def test_the_first_step_is_timed_from_the_start_however_it_was_exported_before(tmp_path: Path) -> None:
    """The console's first line had no ``| time`` under torchrun (a step's time was first close to
    first close), and a periodic export before the first flush moved the step's start: timed from
    it, step 0 read 160 µs. Now a run's first window starts when its closer began."""
    (tmp_path / "setup_first.py").write_text(SETUP_THEN_STEPS)
    done = _run([*TORCHRUN, "setup_first.py"], tmp_path, _env(tmp_path, COLUMNS="200"))
    assert done.returncode == 0, done.stderr[-3000:]
    took = console_step_times(done.stdout)
    assert sorted(took) == [0, 1, 2], done.stdout[-2000:]
    assert took[0] >= 3.0 and 0.0 < took[1] < took[0] and 0.0 < took[2] < took[0], took
