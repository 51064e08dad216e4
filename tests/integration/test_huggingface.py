"""Hugging Face Transformers: a Trainer on a tiny model built in the test logs through
``RankscopeCallback`` into a real sink; its JSONL view holds the Trainer's own logged values
at the Trainer's global steps, in the order the Trainer logged them. A lone process's Trainer
prints its steps once, on rankscope's console, in that order: its own printing of the logs is
quiet (its tqdm bar is not)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rankscope.sink import BookConfig

from ..pipeline import clean_env, console_step_times, last_json, run_worker

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
    done = run_worker("hf_trainer.py", str(STEPS), env=env, cwd=tmp_path)
    history = last_json(done)["history"]
    sink.finalize("hf")
    assert sink.wait_written("hf")
    rows: dict[int, dict[str, float]] = {}
    for line in view.read_text().splitlines():
        row = json.loads(line)
        rows.setdefault(row["step"], {})[row["key"]] = row["value"]
    logged = [entry for entry in history if "loss" in entry]
    assert [entry["step"] for entry in logged] == list(range(1, STEPS + 1))
    for entry in logged:  # the Trainer's own numbers, at its own steps, in the order it logged them
        assert rows[entry["step"]]["loss"] == pytest.approx(entry["loss"], rel=1e-6)
        assert rows[entry["step"]]["learning_rate"] == pytest.approx(entry["learning_rate"], rel=1e-6)
        assert [key for key in rows[entry["step"]] if key in entry] == [key for key in entry if key != "step"]
    # this sink prints elsewhere (its views are its own): the Trainer's PrinterCallback still prints
    assert done.stdout.count("{'loss': ") == STEPS, done.stdout[-3000:]
    final = history[-1]
    assert rows[final["step"]]["train_runtime"] == pytest.approx(final["train_runtime"], rel=1e-6)


@pytest.mark.timeout(240)
def test_the_steps_between_logs_belong_to_the_step_that_logs_next(
    make_sink, tmp_path: Path, capsys, monkeypatch
) -> None:
    """``logging_steps=2``: training steps 3 and 4 are step 4, what they record, time and trace
    (step 3 sleeps 0.4 s: step 4's time, not step 2's). They were step 2's before: it stayed open
    until step 4 logged, and the step the job died in took the last logged step's number."""
    monkeypatch.setenv("COLUMNS", "1000")  # a step's line on one line
    view = tmp_path / "view.jsonl"
    sink = make_sink(
        backends={"jsonl": {"logging_mode": "global_reduce", "path": str(view)}, "console": {}},
        book=BookConfig(grace=30),
    )
    env = clean_env(RANKSCOPE_EXPERIMENT="hf2", RANKSCOPE_ENDPOINT=sink.endpoint, RANKSCOPE_ROLE="trainer")
    watched = last_json(run_worker("hf_trainer.py", "6", "2", "3", env=env, cwd=tmp_path))
    assert watched["current"] == {"1": 2, "2": 2, "3": 4, "4": 4, "5": 6, "6": 6}, watched["current"]
    sink.finalize("hf2")
    assert sink.wait_written("hf2")
    rows: dict[int, dict[str, float]] = {}
    for line in view.read_text().splitlines():
        row = json.loads(line)
        rows.setdefault(row["step"], {})[row["key"]] = row["value"]
    assert sorted(rows) == [2, 4, 6], sorted(rows)
    said = capsys.readouterr().out  # the sink's console: each step's time, first close to first close
    took = console_step_times(said)
    assert took.get(4, 0.0) >= 0.4 > took.get(6, 1.0), (took, said[-3000:])


LONE_TRAINER = """
import sys
import tempfile

import torch
from transformers import Trainer, TrainingArguments

from rankscope.huggingface import RankscopeCallback


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x, labels):
        return {"loss": torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), labels)}


class Data(torch.utils.data.Dataset):
    def __init__(self):
        self.x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
        self.y = self.x.sum(-1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


torch.manual_seed(0)
with tempfile.TemporaryDirectory() as out:
    args = TrainingArguments(
        output_dir=out, max_steps=int(sys.argv[1]), per_device_train_batch_size=8, logging_steps=1, report_to=[],
        save_strategy="no", use_cpu=True, disable_tqdm=sys.argv[2] == "printer", dataloader_num_workers=0,
    )
    Trainer(model=Tiny(), args=args, train_dataset=Data(), callbacks=[RankscopeCallback()]).train()
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("printer", ["progress", "printer"])
def test_a_lone_trainers_steps_are_printed_once_in_logged_order(tmp_path: Path, printer: str) -> None:
    """``python train.py`` with nothing configured: rankscope's console prints each step's
    ``loss``, ``grad_norm``, ``learning_rate``, ``epoch`` in the Trainer's order, and the Trainer's
    own dict of them (its ProgressCallback's, or with ``disable_tqdm`` its PrinterCallback's) is
    not printed beside it; the tqdm bar still is."""
    script = tmp_path / "train.py"
    script.write_text(LONE_TRAINER)
    done = subprocess.run(
        [sys.executable, str(script), str(STEPS), printer],
        env=clean_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "{" not in done.stdout, done.stdout  # neither a step's dict nor the final train_runtime one
    if printer == "progress":
        assert f"{STEPS}/{STEPS} [" in done.stderr, done.stderr[-2000:]  # the tqdm bar is drawn
    lines = re.findall(r"^step (\d+)  (\S+) \S+  (\S+) \S+  (\S+) \S+  (\S+) \S+(?:  |$)", done.stdout, re.M)
    assert [step for step, *_ in lines] == [str(step) for step in range(1, STEPS + 1)], done.stdout  # once each
    assert all(keys == ["loss", "grad_norm", "learning_rate", "epoch"] for _, *keys in lines), done.stdout
