"""Global and per-process views of torchrun ranks through the embedded sink, in the console and in
one W&B run read back from W&B's own files."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

from ..conftest import ROOT
from ..wandb_file import by_step, run_files, run_id


def expected(step: int, ranks: int = 4) -> dict[str, float]:
    values = [float(v) for r in range(ranks) for v in (r + step, 2 * r + step)]
    return {
        "loss": statistics.fmean(values),
        "loss_std": statistics.pstdev(values),
        "loss_max": max(values),
        "samples": 8.0 * ranks,
        "loss_max/argmax_rank": float(ranks - 1),
        "spike": 10.0,
        "spike/argmax_rank": float(step % ranks),  # the rank holding the extreme, not the last one
        "floor": -1.0,
        "floor/argmin_rank": float((step + 1) % ranks),
    }


def test_torchrun_ranks_global_and_per_rank_views_in_console_and_one_wandb_run(tmp_path: Path) -> None:
    views = {
        "console": {"logging_mode": "global_reduce", "format": "full"},  # every key, to compare
        "wandb": {"logging_mode": "global_reduce", "dir": str(tmp_path), "project": "rankscope-tests"},
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "OTEL_"))}
    env.update(WANDB_MODE="offline", RANKSCOPE_RUNTIME_DIR=str(tmp_path / "run"), RANKSCOPE_EXPERIMENT="tr-4")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4"]
    command += [str(ROOT / "tests" / "workers" / "sink_worker.py"), json.dumps(views)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240, check=False, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]

    blocks = re.findall(r"=== \[GlobalReduce\] - METRICS STEP (\d+) ===\n(.*?)\n===============", result.stdout, re.S)
    assert [int(step) for step, _ in blocks] == [0, 1, 2], result.stdout
    for step, body in blocks:
        printed = dict(line.split(": ") for line in body.splitlines())
        assert {k: float(v.split(" (")[0]) for k, v in printed.items()} == expected(int(step))
        for key, value in expected(int(step)).items():  # the console names the process holding the extreme
            if key.endswith("_rank"):
                assert printed[key] == f"{value} (trainer_r{int(value)})", (step, key)

    (path,) = run_files(tmp_path)  # exactly one run for the experiment
    assert run_id(path).startswith("tr-4-")  # the experiment, then a hash of it and torchrun's run id
    rows = by_step([path])
    assert sorted(rows) == [0, 1, 2]
    for step, row in rows.items():
        for key, value in expected(step).items():
            assert row[key] == value, (step, key)
        for rank in range(4):  # per-rank series in the same run
            mine = [float(v) for v in (rank + step, 2 * rank + step)]
            assert row[f"trainer/r{rank}/loss"] == statistics.fmean(mine)
            assert row[f"trainer/r{rank}/samples"] == 8.0
