"""Anomalies caught where they happen (issue 17): non-finite provenance and per-step detectors,
over real torchrun ranks into a real sink, read back from its JSONL view and status route."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from .conftest import ROOT
from .pipeline import clean_env

WORKER = str(ROOT / "tests" / "workers" / "anomaly_worker.py")


def _torchrun(mode: str, steps: int, env: dict[str, str], cwd: Path) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4", WORKER, mode]
    done = subprocess.run([*cmd, str(steps)], env=env, cwd=cwd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_nan_on_one_rank_is_counted_in_its_step_and_named_with_its_first_occurrence(
    make_sink, tmp_path: Path
) -> None:
    path = tmp_path / "global.jsonl"
    sink = make_sink(backends={"jsonl": {"logging_mode": "global_reduce", "path": str(path)}}, grace=30)
    env = clean_env(RANKSCOPE_EXPERIMENT="nan", RANKSCOPE_ENDPOINT=sink.endpoint)
    _torchrun("nan", 6, env, tmp_path)
    sink.finalize("nan")
    assert sink.wait_written("nan")
    status = sink.status("nan")
    rows = _rows(path)
    counted = {r["step"]: r["value"] for r in rows if r.get("key") == "rankscope/nonfinite_values"}
    assert counted == {0: 0.0, 1: 0.0, 2: 0.0, 3: 1.0, 4: 0.0, 5: 0.0}
    loss = {r["step"]: r["value"] for r in rows if r["kind"] == "global_reduce" and r["key"] == "loss"}
    assert loss[3] != loss[3] and loss[2] == 2.5  # NaN stays NaN in the view
    first = {"step": 3, "key": "loss", "process": "trainer_r2", "role": "trainer", "replica": None, "rank": 2}
    assert status["first_nonfinite"] == first
    (anomaly,) = [r for r in rows if r["kind"] == "anomaly"]
    assert anomaly["type"] == "nonfinite" and anomaly["first"] is True and anomaly["count"] == 1
    assert {k: anomaly[k] for k in first} == first
    assert status["anomaly_counts"] == {"nonfinite": 1}
