"""``benchmarks/bench_views.py`` short: every arm runs (each view made, fed and finished in its
child, nothing it was handed lost) and the report's lines are there. The figures of so short a run
mean nothing. (``bench_view_install.py`` installs from PyPI into fresh venvs: it is run by hand,
not in CI, whose suite is kept near 40 minutes and off the network.)"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from ..conftest import ROOT


@pytest.mark.timeout(300)
def test_the_views_benchmark_runs_each_view_and_reports_its_cost_per_step() -> None:
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_views.py"), "--keys", "20", "--steps", "20"]
    command += ["--rounds", "1", "--views", "none,jsonl,console,tensorboard,mlflow"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for view in ("none", "jsonl", "console", "tensorboard", "mlflow"):  # mlflow: a real server, started by it
        assert re.search(rf"^{view} +\d+ µs \(\d+-\d+\)  ratio to jsonl \d+\.\d\dx$", done.stdout, re.M), done.stdout
    assert "not measured" not in done.stdout
