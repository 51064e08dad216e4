"""``benchmarks/bench_sink.py`` short: every stage of the walk (the bare decode, the edge alone,
the edge and the book called directly, gRPC with and without the write-ahead log) takes every
point of the same requests and writes every step, and the walk prints a line per stage. The figures
of so small a run mean nothing; docs/benchmarks.md has the 1,024-rank ones."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from ..conftest import ROOT


@pytest.mark.timeout(240)
def test_every_stage_of_the_sink_benchmark_takes_every_point(tmp_path) -> None:
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_sink.py"), "--ranks", "32", "--keys", "10"]
    done = subprocess.run([*command, "--repeats", "1"], cwd=tmp_path, capture_output=True, text=True, timeout=220)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]  # a stage short of a point fails
    out = done.stdout
    assert "32 ranks x 10 keys x 3 steps = 960 points" in out, out
    stages = ("bare decode-and-walk", "the edge alone", "edge + book, called directly", "sink ingest (gRPC")
    line = r".*: [\d,]+ \([\d,]+-[\d,]+\) points/s = \d+% of bare decode"
    for stage in stages:
        assert re.search(rf"^  {re.escape(stage)}{line}", out, re.M), out
    assert len(re.findall(r"us/point$", out, re.M)) == len(stages) - 1, out
