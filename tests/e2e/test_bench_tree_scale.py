"""``benchmarks/bench_tree_scale.py`` short: 256 ranks x 20 keys through 2 real agents, the gateway
and a sink, every step's values and extremes' ranks equal to the formula's, nobody missing, and
the direct-to-sink sweep run once. In ``e2e`` because it runs the built Collector (the session
builds it before any test's time limit starts: ``conftest.py``). The figures of so small a run
mean nothing; docs/pipeline.md has the 10,000-rank ones."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ..conftest import ROOT


@pytest.mark.timeout(150)
def test_the_tree_benchmark_checks_every_step_against_what_was_sent(binaries, tmp_path) -> None:
    small = "--ranks 256 --keys 20 --agents 2 --steps 3 --warmup 1 --period 2 --sweep 64 --sweep-steps 3"
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_tree_scale.py"), *small.split()]
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.terminate()  # on SIGTERM the benchmark stops its Collectors, sinks and sender
        out, _ = proc.communicate(timeout=20)
        pytest.fail(f"the benchmark ran past 120 s:\n{out[-4000:]}")
    assert proc.returncode == 0, out[-6000:]
    lines = out.splitlines()
    steps = [line for line in lines if "extremes' ranks exact; missing_processes [0.0]" in line]
    assert len(steps) == 3, out
    assert any("sink: 256 ranks in the roster (0 processes of their own)" in line for line in lines), out
    assert any(line.lstrip().startswith("64 ranks") and line.endswith("keeps up") for line in lines), out
    assert lines[-1] == "bench_tree_scale: PASS (0 failed checks)", out
