"""PyTorch Lightning: a 2-process DDP run on CPU whose ``self.log`` values reach the experiment's
W&B run (offline, read back from its file) through a real sink, reduced across ranks; and the same
job under plain ``python`` with nothing configured, whose ranks share the embedded sink."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from rankscope.sink import BookConfig

from ..conftest import ROOT
from ..pipeline import clean_env
from ..wandb_file import by_step, run_files

pytest.importorskip("lightning")

STEPS = 5


def test_self_log_values_of_two_ddp_ranks_reach_the_wandb_run(make_sink, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    wandb = {"logging_mode": "global_reduce", "dir": str(tmp_path), "mode": "offline"}
    sink = make_sink(backends={"wandb": wandb}, book=BookConfig(grace=30))
    env = clean_env(RANKSCOPE_EXPERIMENT="lightning", RANKSCOPE_ENDPOINT=sink.endpoint, WANDB_MODE="offline")
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "workers" / "lightning_ddp.py"), str(STEPS)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    sink.finalize("lightning")
    assert sink.wait_written("lightning")
    assert sink.status("lightning")["processes"] == 2
    sink.stop()
    rows = by_step(run_files(tmp_path))
    logged = [step for step, row in rows.items() if "train/rank" in row]
    assert len(logged) == STEPS, rows
    for step in logged:
        assert rows[step]["train/rank"] == 0.5  # MEAN over the two ranks
        assert rows[step]["train/rank_max"] == 1.0
        assert rows[step]["train/rank_max/argmax_rank"] == 1.0
        assert rows[step]["rankscope/missing_processes"] == 0
        assert rows[step]["train/loss"] > 0


def test_a_ddp_job_under_plain_python_prints_both_ranks_steps(tmp_path: Path) -> None:
    """``python train.py`` with ``rs.init(experiment=...)`` first and ``Trainer(strategy="ddp", devices=2)``:
    Lightning's launcher makes the launching process rank 0; both ranks reach one embedded sink,
    whose console prints each step's mean over the two (``train/rank`` 0.5)."""
    env = {k: v for k, v in clean_env().items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK")}
    env["RANKSCOPE_RUNTIME_DIR"] = str(tmp_path / "runtime")
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "workers" / "lightning_ddp.py"), str(STEPS), "newcomer-lightning"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    steps = re.findall(r"^step (\d+)  .*train/rank (\S+)  train/rank_max 1 \(trainer_r1\)", done.stdout, re.M)
    assert steps == [(str(step), "0.5") for step in range(STEPS)], done.stdout + done.stderr[-2000:]
    said = [line for line in done.stderr.splitlines() if line.startswith("rankscope: experiment newcomer-lightning")]
    assert "metrics -> the experiment's embedded sink on this machine" in said[-1], said
