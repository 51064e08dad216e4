"""What a newcomer runs in the first hour, run as they run it (issue 41): a script of one's own
with ``rs.init(experiment=...)`` and nothing else, the getting-started snippet as written, a
mistyped endpoint, a dead one, and a profile captured on a box without CUDA. Each is a fresh
``python script.py`` in a directory of its own, its output read as a person reads it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ..conftest import ROOT, free_port
from ..pipeline import console_step_times

_LAUNCHER = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK")


def run_script(
    tmp_path: Path, code: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python script.py`` in ``tmp_path``, in an environment with nothing of rankscope's set."""
    script = tmp_path / "script.py"
    script.write_text(code)
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RANKSCOPE_", "OTEL_", "TORCHELASTIC_", "SLURM_")) and k not in _LAUNCHER
    }
    clean |= {"RANKSCOPE_RUNTIME_DIR": str(tmp_path / "runtime"), **(env or {})}
    return subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=clean, capture_output=True, text=True, timeout=timeout
    )


NEWCOMER = """
import rankscope as rs

rs.init(experiment="newcomer")
for step in range(6):
    rs.record_metric("loss", float("nan") if step in (2, 3) else 1.0 / (step + 1))
    rs.record_metric("accuracy", 0.1 * step)
    rs.flush(step)
rs.shutdown()
"""


@pytest.mark.timeout(120)
def test_a_lone_script_with_nothing_configured_says_where_and_prints_each_step_and_its_nan(tmp_path: Path) -> None:
    done = run_script(tmp_path, NEWCOMER)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = re.findall(r"^step (\d)  loss (\S+)  accuracy (\S+)  \| time \S+$", done.stdout, re.M)
    assert steps == [  # the keys in the order the script recorded them
        ("0", "1", "0"),
        ("1", "0.5", "0.1"),
        ("2", "nan", "0.2"),
        ("3", "nan", "0.3"),
        ("4", "0.2", "0.4"),
        ("5", "0.1667", "0.5"),
    ], done.stdout
    assert re.findall(r"^!!! .*$", done.stdout, re.M) == ["!!! step 2 non-finite value: loss (nan)"]  # once a streak
    said = [line for line in done.stderr.splitlines() if line.startswith("rankscope: experiment newcomer")]
    assert len(said) == 1 and "metrics -> this console, one line per step" in said[0], done.stderr


@pytest.mark.timeout(120)
def test_a_lone_scripts_first_step_is_timed_from_its_start_past_a_periodic_export(tmp_path: Path) -> None:
    """Before its first flush a process exports what it recorded each second, without a step; that
    export had moved the step's start, and step 0's time read from it."""
    script = NEWCOMER.replace(
        'rs.init(experiment="newcomer")',
        'rs.init(experiment="newcomer")\nimport time\nrs.record_metric("params", 1.0)\ntime.sleep(2.5)',
    )
    done = run_script(tmp_path, script, {"COLUMNS": "200"})
    assert done.returncode == 0, done.stderr[-3000:]
    took = console_step_times(done.stdout)
    assert sorted(took) == list(range(6)) and took[0] >= 2.5 and took[1] < 2.5, done.stdout


def test_a_mistyped_endpoint_fails_at_init_naming_the_variable(tmp_path: Path) -> None:
    for value, why in (
        ("localhost:43l7", "its port is not a number from 1 to 65535"),
        ("htp://localhost:4317", "'htp':// is not a scheme rankscope exports to"),
    ):
        done = run_script(tmp_path, NEWCOMER, {"RANKSCOPE_ENDPOINT": value}, timeout=60)
        assert done.returncode == 1, done.stderr[-2000:]
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith(f"ValueError: RANKSCOPE_ENDPOINT={value!r}: must be host:port") and why in last, last
        assert done.stdout == ""


def test_a_dead_endpoints_warning_shows_no_line_of_rankscopes_source(tmp_path: Path) -> None:
    done = run_script(tmp_path, NEWCOMER.replace("nan", "1.0"), {"RANKSCOPE_ENDPOINT": f"127.0.0.1:{free_port()}"})
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stderr.splitlines()
    warned = [i for i, line in enumerate(lines) if "metric points were dropped at shutdown" in line]
    assert len(warned) == 1, done.stderr
    assert lines[warned[0]].startswith("rankscope:0: RuntimeWarning:"), lines[warned[0]]  # no user line led to it
    assert "src/rankscope" not in done.stderr and "self.drops" not in done.stderr  # no internal file or source line
    assert all(not line.startswith(" ") for line in lines), done.stderr


def test_the_getting_started_snippet_runs_as_written(tmp_path: Path) -> None:
    page = (ROOT / "docs" / "getting-started.md").read_text()
    snippet = re.search(r"^## Use\n.*?```python\n(.*?)```", page, re.S | re.M)
    assert snippet, "no python snippet under ## Use"
    done = run_script(tmp_path, snippet.group(1))
    assert done.returncode == 0, done.stderr[-3000:]
    losses = [
        float(v) for v in re.findall(r"^step \d+  reward \S+  reward/max \S+  loss (\S+)  \| time", done.stdout, re.M)
    ]
    assert len(losses) == 20 and losses[-1] < losses[0] / 4, done.stdout  # it trains, and says so per step
    assert "rankscope: experiment first-steps run " in done.stderr


CAPTURE = """
import time
import torch
import rankscope as rs

rs.init(experiment="capture-on-cpu")
for step in range(60):
    if step == 0:  # before the job's sink took anything of this process: the request waits for it
        rs.capture("look", steps=1)
    torch.randn(64, 64) @ torch.randn(64, 64)
    rs.record_metric("loss", 1.0)
    time.sleep(0.1)
    rs.flush(step)
rs.shutdown()
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="what a box without CUDA prints")
@pytest.mark.timeout(180)
def test_a_profile_captured_on_a_box_without_cuda_prints_no_cuda_error(tmp_path: Path) -> None:
    done = run_script(tmp_path, CAPTURE, {"RANKSCOPE_SINK": "embedded"}, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    traces = list((tmp_path / "rankscope_artifacts").rglob("*.pt.trace.json.gz"))
    assert traces, done.stdout[-2000:] + done.stderr[-2000:]  # the capture was taken and sent
    out = done.stdout + done.stderr
    for noise in ("gpuGetDeviceCount", "code 35", "USDT:", "ERROR:"):
        assert noise not in out, out[-3000:]
    assert "KINETO_LOG_LEVEL" not in os.environ


@pytest.mark.timeout(120)
def test_a_lone_scripts_hint_followed_literally_keeps_its_console_and_says_where_the_report_is(tmp_path: Path) -> None:
    first = run_script(tmp_path, NEWCOMER)
    hint = re.search(r"RANKSCOPE_BACKENDS='([^']+)'", first.stderr)
    assert hint, first.stderr
    again = run_script(
        tmp_path, NEWCOMER.replace("rs.shutdown()", "rs.init()\nrs.shutdown()"), {"RANKSCOPE_BACKENDS": hint.group(1)}
    )  # a re-init finishes the views once more: the page is still said once
    assert again.returncode == 0, again.stderr[-3000:]
    assert re.search(r"^step 5  loss 0\.1667  accuracy 0\.5", again.stdout, re.M), (
        again.stdout
    )  # as before: no [main_r0]
    pages = re.findall(r"^report: (\S+)$", again.stdout, re.M)
    assert len(pages) == 1 and (tmp_path / pages[0]).is_file(), again.stdout


EARLY = """
import glob, os, time
import rankscope as rs

rs.init(experiment="early")
announced = os.path.join(os.environ["RANKSCOPE_RUNTIME_DIR"], "rankscope-*", "*", "sink.json")
deadline = time.monotonic() + 30
while not glob.glob(announced) and time.monotonic() < deadline:  # the job's setup: nothing recorded
    time.sleep(0.05)
print("sink up before the first step:", bool(glob.glob(announced)), flush=True)
rs.record_metric("loss", 1.0)
rs.flush(0)
"""


@pytest.mark.timeout(120)
def test_a_jobs_embedded_sink_starts_at_init_while_the_job_sets_up(tmp_path: Path) -> None:
    """``rs.init`` in a job with an embedded sink starts the sink on the export thread at once: its
    start (seconds on a busy box) no longer comes after the first step, holding back its line."""
    done = run_script(tmp_path, EARLY, {"RANKSCOPE_SINK": "embedded"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "sink up before the first step: True" in done.stdout, done.stdout + done.stderr[-3000:]
    assert re.search(r"^step 0  loss 1\b", done.stdout, re.M), done.stdout
