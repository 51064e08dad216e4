"""The NVML instrumentor (issue 17, item 4) in a fresh process without a GPU: silently off (no
warning, no ``gpu/`` keys beside the run's own)."""

from __future__ import annotations

import json
from pathlib import Path

from ..conftest import run_python

JOB = """
import json, sys, warnings
warnings.simplefilter("error")
from rankscope.instrumentation import GpuHealthInstrumentor
GpuHealthInstrumentor().instrument()
import torch, rankscope as rs
rs.init(experiment="nvml-off", backends={"jsonl": {"logging_mode": "per_rank_reduce", "path": sys.argv[1]}})
for step in range(3):
    rs.record_metric("loss", 1.0)
    rs.flush(step)
rs.shutdown()
"""


def test_without_a_gpu_the_instrumentor_is_silently_off(tmp_path: Path) -> None:
    out = tmp_path / "rank.jsonl"
    done = run_python(f"import sys; sys.argv = ['job', {str(out)!r}]\n" + JOB)
    assert done.returncode == 0 and done.stderr == "", done.stderr[-2000:]
    keys = {json.loads(line)["key"] for line in out.read_text().splitlines()}
    assert "loss" in keys and not any(k.startswith("gpu/") for k in keys)
