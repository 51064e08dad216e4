"""``benchmarks/bench_retained.py`` short: both arms run their children through a real step book
(every step finalized, a packed and a live step's late update built), and the report's lines are
there. The figures of 30 steps of 50 keys mean nothing."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from ..conftest import ROOT


@pytest.mark.timeout(240)
def test_the_retained_benchmark_runs_both_arms_and_reports_the_window() -> None:
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_retained.py"), "--keys", "50", "--steps", "30"]
    done = subprocess.run([*command, "--rounds", "1"], cwd=ROOT, capture_output=True, text=True, timeout=220)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"ratio kept in memory / baseline: +\d+\.\d+", done.stdout), done.stdout
    assert re.search(r"ratio kept on disk too / baseline: +\d+\.\d+", done.stdout), done.stdout
    assert re.search(r"kept.log after the run: \d+\.\d+ MB", done.stdout), done.stdout
    packed = re.search(r"window after the run: (\d+) steps packed", done.stdout)
    assert packed and int(packed.group(1)) == 30 - 16, done.stdout  # all but the 16 live ones, packed
    assert "packed step:" in done.stdout and "live step:" in done.stdout
