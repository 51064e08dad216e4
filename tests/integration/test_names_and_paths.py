"""Names and one path, from the newcomer's commands: an unnamed script run twice is two runs of
one experiment named after the script, each run's page at ``rankscope_logs/<experiment>/<run>/
report.html``, and ``rankscope report`` takes the experiment's directory (all its runs) or a run's.

Before: each launch of an unnamed script was an experiment of its own, named by a generated id
(under torchrun, the experiment and the run were both torchrun's uuid), and ``rankscope report
rankscope_logs/ID/``, as docs/report.md showed it, failed with ``[Errno 2] ... report.jsonl``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

TRAIN = """\
import rankscope as rs

rs.init(backends={"report": {}})  # no experiment named: the script's name is
for step in range(3):
    rs.record_metric("loss", 1.0 / (step + 1))
    rs.flush(step)
rs.shutdown()
"""

RUN_DIR = re.compile(r"\d{8}-\d{6}-[0-9a-f]{8}")
"""A run as it is shown: its start time and a short id."""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "OTEL_", "TORCHELASTIC_", "SLURM_"))}


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.timeout(240)
def test_an_unnamed_script_run_twice_is_two_runs_of_one_experiment_and_report_takes_either_directory(
    tmp_path: Path,
) -> None:
    (tmp_path / "train.py").write_text(TRAIN)
    for _ in range(2):
        launched = _run(tmp_path, "train.py")
        assert launched.returncode == 0, launched.stderr[-3000:]

    experiment = tmp_path / "rankscope_logs" / "train"
    assert sorted(p.name for p in (tmp_path / "rankscope_logs").iterdir()) == ["train"]
    runs = sorted(p for p in experiment.iterdir() if p.is_dir())
    assert len(runs) == 2 and all(RUN_DIR.fullmatch(r.name) for r in runs), runs
    assert all((r / "report.html").is_file() and (r / "report.jsonl").is_file() for r in runs)

    one = _run(tmp_path, "-m", "rankscope.cli", "report", f"rankscope_logs/train/{runs[0].name}/")
    assert one.returncode == 0, one.stderr[-2000:]
    assert f"rankscope_logs/train/{runs[0].name}/report.html" in one.stderr

    every = _run(tmp_path, "-m", "rankscope.cli", "report", "rankscope_logs/train/")
    assert every.returncode == 0, every.stderr[-2000:]
    assert "Errno" not in every.stderr
    written = {Path(p) for p in re.findall(r"-> (\S+\.html)", every.stderr)}
    assert written and all((tmp_path / p).is_file() for p in written), every.stderr
