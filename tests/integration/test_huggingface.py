"""Hugging Face Transformers: a Trainer on a tiny model built in the test logs through
``RankscopeCallback`` into a real sink; its JSONL view holds the Trainer's own logged values
at the Trainer's global steps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rankscope.sink import BookConfig

from ..conftest import ROOT
from ..pipeline import clean_env

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

STEPS = 4


@pytest.mark.timeout(240)
def test_trainer_logs_land_in_the_experiment_at_the_trainers_steps(make_sink, tmp_path: Path) -> None:
    view = tmp_path / "view.jsonl"
    sink = make_sink(
        backends={"jsonl": {"logging_mode": "global_reduce", "path": str(view)}}, book=BookConfig(grace=30)
    )
    env = clean_env(RANKSCOPE_EXPERIMENT="hf", RANKSCOPE_ENDPOINT=sink.endpoint, RANKSCOPE_ROLE="trainer")
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "workers" / "hf_trainer.py"), str(STEPS)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    history = json.loads(done.stdout.strip().splitlines()[-1])
    sink.finalize("hf")
    assert sink.wait_written("hf")
    rows: dict[int, dict[str, float]] = {}
    for line in view.read_text().splitlines():
        row = json.loads(line)
        rows.setdefault(row["step"], {})[row["key"]] = row["value"]
    logged = [entry for entry in history if "loss" in entry]
    assert [entry["step"] for entry in logged] == list(range(1, STEPS + 1))
    for entry in logged:  # the Trainer's own numbers, at its own steps
        assert rows[entry["step"]]["loss"] == pytest.approx(entry["loss"], rel=1e-6)
        assert rows[entry["step"]]["learning_rate"] == pytest.approx(entry["learning_rate"], rel=1e-6)
    final = history[-1]
    assert rows[final["step"]]["train_runtime"] == pytest.approx(final["train_runtime"], rel=1e-6)
