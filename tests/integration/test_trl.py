"""TRL: a real GRPOTrainer (tiny model and tokenizer built in the worker, two processes under
torchrun, gloo, CPU) instrumented by ``rankscope.trl`` into a real sink. Its logged metrics land in
one experiment per global step, its completions become a sample table ranked by reward (exactly the
step's best and worst across both processes, with provenance), and each step's trace holds its
generate, score and train phases in that order."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from rankscope.sink import BookConfig

from ..conftest import ROOT, free_port
from ..pipeline import clean_env

pytest.importorskip("trl")

STEPS = 3
PHASES = ("grpo/generate", "grpo/score", "grpo/train")


@pytest.mark.timeout(420)
def test_grpo_metrics_completions_and_phases_land_in_one_experiment(make_sink, tmp_path: Path) -> None:
    view = tmp_path / "view.jsonl"
    sink = make_sink(
        backends={"jsonl": {"logging_mode": "global_reduce", "path": str(view)}}, book=BookConfig(grace=30)
    )
    env = clean_env(RANKSCOPE_EXPERIMENT="grpo", RANKSCOPE_ENDPOINT=sink.endpoint, RANKSCOPE_ROLE="trainer")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}"]
    done = subprocess.run(
        [*command, str(ROOT / "tests" / "workers" / "grpo_worker.py"), str(STEPS), str(tmp_path)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    reports = {r["rank"]: r for r in (json.loads(p.read_text()) for p in tmp_path.glob("report-*.json"))}
    assert set(reports) == {0, 1}
    sink.finalize("grpo")
    assert sink.wait_written("grpo")
    spans = sink.spans("grpo") or []
    sink.stop()
    lines = [json.loads(line) for line in view.read_text().splitlines()]
    values: dict[int, dict[str, float]] = defaultdict(dict)
    for line in lines:
        if "key" in line:
            values[line["step"]][line["key"]] = line["value"]

    _check_metrics(reports, values)
    _check_completions(reports, [line for line in lines if line.get("kind") == "sample"])
    _check_phases(spans)


def _check_metrics(reports: dict[int, Any], values: dict[int, dict[str, float]]) -> None:
    """The trainer's own logged numbers at its own global steps (TRL averaged them over processes)."""
    logged = [entry for entry in reports[0]["history"] if "reward" in entry]
    assert [entry["step"] for entry in logged] == list(range(1, STEPS + 1))
    for entry in logged:
        for key in ("reward", "reward_std", "loss", "completions/mean_length", "rewards/blue_reward/mean"):
            assert values[entry["step"]][key] == pytest.approx(entry[key], rel=1e-6, abs=1e-9), key
        for phase in PHASES:  # each phase's duration, in the step it ran in
            assert values[entry["step"]][f"{phase}/total_duration_avg_s"] > 0


def _check_completions(reports: dict[int, Any], samples: list[dict[str, Any]]) -> None:
    """Exactly the step's two best and two worst rewards of both processes, each with its provenance."""
    offered: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for rank, report in reports.items():
        for row in report["offered"]:
            offered[row["step"]].append({**row, "rank": rank})
    assert sorted(offered) == list(range(1, STEPS + 1)) and all(len(rows) == 8 for rows in offered.values())
    for rows in offered.values():  # each row's rewards are its own completion's (this process's slice of TRL's)
        for row in rows:
            words = row["completion"].split()
            assert row["reward/blue_reward"] == words.count("blue")
            assert row["reward"] == pytest.approx(words.count("blue") - 0.1 * len(words), abs=1e-5)
    kept = [line for line in samples if line["table"] == "grpo/completions"]
    columns = ("prompt", "completion", "reward", "advantage")
    for step, rows in offered.items():
        rewards = sorted(row["reward"] for row in rows)
        mine = [line for line in kept if line["step"] == step]
        assert sorted(line["row"]["reward"] for line in mine if line["side"] == "top") == rewards[-2:]
        assert sorted(line["row"]["reward"] for line in mine if line["side"] == "bottom") == rewards[:2]
        for line in mine:  # each kept row is one its process offered
            candidates = [{k: r[k] for k in columns} for r in rows if r["rank"] == line["rank"]]
            assert {k: line["row"][k] for k in columns} in candidates, line
            assert line["role"] == "trainer" and line["trace_id"]


def _check_phases(spans: list[Any]) -> None:
    """Each step's trace: on every process, generate, then score, then train."""
    by_process_step: dict[tuple[int, int], dict[str, Any]] = defaultdict(dict)
    for span in spans:
        if span.name in PHASES:
            by_process_step[(span.process.rank, span.step)][span.name] = span
    for rank in (0, 1):
        for step in range(1, STEPS + 1):
            phase = by_process_step[(rank, step)]
            assert set(phase) == set(PHASES), (rank, step, sorted(phase))
            generate, score, train = (phase[name] for name in PHASES)
            assert generate.end_ns <= score.start_ns <= score.end_ns <= train.start_ns < train.end_ns
            assert len({generate.trace_id, score.trace_id, train.trace_id}) == 1
