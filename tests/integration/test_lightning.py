"""PyTorch Lightning: a 2-process DDP run on CPU whose ``self.log`` values reach the experiment's
W&B run (offline, read back from its file) through a real sink, reduced across ranks; and the same
job under plain ``python`` with nothing configured, whose ranks share the embedded sink, which
prints the keys in the order ``self.log`` logged them, a renamed key said once."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rankscope.sink import BookConfig

from ..conftest import ROOT
from ..pipeline import clean_env, console_step_times, last_json, run_worker
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
    # the order the worker's training_step logged them in, not A-Z (train/loss first)
    steps = re.findall(
        r"^step (\d+)  train/rank (\S+)  train/rank_max 1 \(trainer_r1\)  train/loss ", done.stdout, re.M
    )
    assert steps == [(str(step), "0.5") for step in range(STEPS)], done.stdout + done.stderr[-2000:]
    said = [line for line in done.stderr.splitlines() if line.startswith("rankscope: experiment newcomer-lightning")]
    assert "metrics -> the experiment's embedded sink on this machine" in said[-1], said


LOGGED_IN_ORDER = """
import sys

import lightning
import torch
from torch.utils.data import DataLoader, TensorDataset

from rankscope.lightning import RankscopeLogger


class Net(lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("loss", loss)
        self.log("acc(%)", 50.0 + self.global_rank)  # recorded as acc_pct: the sink's MEAN is 50.5
        self.log("zeta", 1.0)
        self.log("beta", 2.0)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    trainer = lightning.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_steps=int(sys.argv[1]), log_every_n_steps=1,
        logger=RankscopeLogger(), enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(Net(), DataLoader(data, batch_size=4))
    if trainer.global_rank == 0:
        from lightning.pytorch.callbacks.progress.progress_bar import get_standard_metrics

        import rankscope as rs

        run = rs.get_resource().attributes["rankscope.run.id"]
        print(f"bar v_num {get_standard_metrics(trainer)['v_num']} run {run}", file=sys.stderr)
"""


def test_the_console_shows_keys_in_logged_order_and_rank_0_says_a_rename_once(tmp_path: Path) -> None:
    """A newcomer's DDP job under plain ``python`` (no ``rs.init``) logs ``loss``, ``acc(%)``,
    ``zeta``, ``beta``: the embedded sink's console prints them in that order (Lightning's
    ``epoch`` after them), and ``acc(%)``'s new name is said once, by rank 0, for all steps and both ranks."""
    script = tmp_path / "train.py"
    script.write_text(LOGGED_IN_ORDER)
    env = {k: v for k, v in clean_env().items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK")}
    env["RANKSCOPE_RUNTIME_DIR"] = str(tmp_path / "runtime")
    done = subprocess.run(
        [sys.executable, str(script), str(STEPS)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if "Lightning key" in line]
    assert said == ["rankscope: Lightning key 'acc(%)' is recorded as 'acc_pct'"], done.stderr[-3000:]
    lines = re.findall(r"^step (\d+)  (\S+ \S+  \S+ \S+  \S+ \S+  \S+ \S+  \S+ \S+)(?:  |$)", done.stdout, re.M)
    assert [step for step, _ in lines] == [str(step) for step in range(STEPS)], done.stdout + done.stderr[-2000:]
    shown = [dict(pair.split(" ") for pair in line.split("  ")) for _, line in lines]
    assert all(values["acc_pct"] == "50.5" for values in shown), shown  # both ranks' mean
    assert all(list(values) == ["loss", "acc_pct", "zeta", "beta", "epoch"] for values in shown), done.stdout
    # Lightning's bar shows the last 4 characters of the logger's version: the run's, told apart
    bar = re.search(r"^bar v_num (\S+) run (\S+)$", done.stderr, re.M)
    assert bar is not None and len(bar[2]) > 8 and bar[1] == bar[2][-4:], done.stderr[-2000:]


@pytest.mark.timeout(240)
def test_the_batches_between_logs_belong_to_the_step_lightning_logs_next(
    make_sink, tmp_path: Path, capsys, monkeypatch
) -> None:
    """``log_every_n_steps=2``: Lightning logs steps 1, 3, 5; batches 2 and 3 are step 3, what they
    record, time and trace (batch 2 sleeps 0.4 s: step 3's time). They were step 1's before: it
    stayed open until step 3 logged, and the step a job died in took the last logged step's number."""
    monkeypatch.setenv("COLUMNS", "1000")  # a step's line on one line
    sink = make_sink(backends={"console": {}}, book=BookConfig(grace=30))
    env = clean_env(RANKSCOPE_EXPERIMENT="pl-steps", RANKSCOPE_ENDPOINT=sink.endpoint, RANKSCOPE_ROLE="trainer")
    current = last_json(run_worker("lightning_steps.py", "2", env=env, cwd=tmp_path))
    assert current == {"0": 1, "1": 1, "2": 3, "3": 3, "4": 5, "5": 5}, current
    sink.finalize("pl-steps")
    assert sink.wait_written("pl-steps")
    said = capsys.readouterr().out  # the sink's console: each step's time, first close to first close
    took = console_step_times(said)
    assert took.get(3, 0.0) >= 0.4 > took.get(5, 1.0), (took, said[-3000:])


def test_a_rank_that_raises_between_logged_steps_leaves_the_record_of_the_step_it_died_in(tmp_path: Path) -> None:
    """Lightning hands values to its logger only at log steps (4, 9, 14 with ``log_every_n_steps=5``):
    rank 1 raises in batch 12 with nothing of step 14 sent. The run's folder still holds the record
    of the job's end in step 14, naming rank 1 first with its error, and the report's table says so."""
    env = {k: v for k, v in clean_env().items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK")}
    env["RANKSCOPE_RUNTIME_DIR"] = str(tmp_path / "runtime")
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "workers" / "lightning_ddp.py"), "30", "pl-crash", "crash"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode != 0 and "boom at 12" in done.stderr, done.stderr[-3000:]
    (folder,) = (tmp_path / "rankscope_logs" / "pl-crash").iterdir()
    records = [json.loads(line) for line in (folder / "report.jsonl").read_text().splitlines()]
    (ended,) = [r for r in records if r.get("kind") == "anomaly" and r.get("type") == "interrupted"]
    assert ended["step"] == 14 and ended["failed"][0] == "trainer_r1", ended
    assert ended["errors"][0] == "RuntimeError: boom at 12", ended
    assert "!!! step 14 failed: trainer_r1 raised RuntimeError: boom at 12" in done.stdout, done.stdout[-2000:]
