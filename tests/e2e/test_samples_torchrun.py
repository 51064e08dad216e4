"""Sample tables across real torchrun ranks through a real sink (issue 16): the experiment keeps
exactly the top and bottom rows of every rank, with provenance, in JSONL and in W&B offline;
a random sample keeps each rank's rows in proportion to how many it recorded."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from rankscope.sink import BookConfig
from rankscope.tracing.spans import step_ids

from ..conftest import ROOT
from ..pipeline import clean_env
from ..wandb_file import history, run_files

WORKER = str(ROOT / "tests" / "workers" / "sample_worker.py")


def _torchrun(mode: str, steps: int, env: dict[str, str], cwd: Path) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4", WORKER, mode]
    done = subprocess.run([*cmd, str(steps)], env=env, cwd=cwd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]


def _samples(path: Path, table: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [row for row in lines if row["kind"] == "sample" and row["table"] == table]


def _wandb_tables(root: Path, table: str) -> dict[int, dict[str, Any]]:
    """Each step's logged W&B Table, read back from the offline run's files."""
    [run] = run_files(root)
    found = {}
    for row in history(run):
        if f"{table}/path" in row:  # W&B flattens the logged Table's reference
            assert row[f"{table}/_type"] == "table-file"
            media = next(run.parent.rglob(Path(row[f"{table}/path"]).name))
            found[int(row["step"])] = json.loads(media.read_text())
    return found


def test_four_ranks_keep_exactly_the_top_and_bottom_two_rows_with_provenance(
    make_sink, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")  # W&B's process-wide settings are made once, from the env
    steps, experiment = 3, "samples-ranked"
    jsonl = tmp_path / "global.jsonl"
    views = {
        "jsonl": {"logging_mode": "global_reduce", "path": str(jsonl)},
        "wandb": {"logging_mode": "global_reduce", "dir": str(tmp_path), "mode": "offline"},
    }
    sink = make_sink(backends=views, book=BookConfig(grace=30))
    env = clean_env(RANKSCOPE_EXPERIMENT=experiment, RANKSCOPE_ENDPOINT=sink.endpoint, WANDB_MODE="offline")
    _torchrun("ranked", steps, env, tmp_path)
    sink.finalize(experiment)
    assert sink.wait_written(experiment)
    spans = {s.span_id: s for s in sink.spans(experiment) or []}
    assert sink.status(experiment)["sample_rows"] == steps * 4 * 4  # each rank sends its 2 + 2
    sink.stop()

    rows = _samples(jsonl, "rollouts")
    tables = _wandb_tables(tmp_path, "rollouts")
    for step in range(steps):
        everything = sorted(100.0 * step + 10.0 * rank + i for rank in range(4) for i in range(5))
        mine = [row for row in rows if row["step"] == step]
        assert [r["row"]["reward"] for r in mine if r["side"] == "top"] == everything[::-1][:2]
        assert [r["row"]["reward"] for r in mine if r["side"] == "bottom"] == everything[:2]
        assert len(mine) == 4
        trace_id = f"{step_ids(experiment, 0, step)[0]:032x}"
        for row in mine:
            rank, i = divmod(int(row["row"]["reward"] - 100 * step), 10)
            assert row["row"]["text"] == f"r{rank} s{step} i{i}"
            assert (row["role"], row["rank"], row["process"]) == ("trainer", rank, f"trainer_r{rank}")
            assert row["policy_version"] == step
            assert row["trace_id"] == trace_id  # the step's trace
            span = spans[row["span_id"]]  # the rollout span that was active when the row was recorded
            assert (span.name, span.process.rank, span.step) == ("rollout", rank, step)
            assert span.start_ns <= row["time"] * 1e9 <= span.end_ns + 1e6
        table = tables[step]
        columns = table["columns"]
        got = [dict(zip(columns, values, strict=True)) for values in table["data"]]
        assert [(r["side"], r["reward"], r["rank"], r["policy_version"]) for r in got] == [
            (r["side"], r["row"]["reward"], r["rank"], r["policy_version"]) for r in mine
        ]
        assert {r["trace_id"] for r in got} == {trace_id} and all(r["step"] == step for r in got)


def test_without_rank_by_each_ranks_rows_are_kept_in_proportion_to_how_many_it_recorded(
    make_sink, tmp_path: Path
) -> None:
    """Rank r records 5(r+1) rows a step (shares 0.1, 0.2, 0.3, 0.4), k=4, 150 steps, seed 11:
    600 kept rows; each share within 0.06 of its expectation (over 3 standard deviations)."""
    steps, experiment = 150, "samples-reservoir"
    jsonl = tmp_path / "global.jsonl"
    sink = make_sink(
        backends={"jsonl": {"logging_mode": "global_reduce", "path": str(jsonl)}}, book=BookConfig(grace=30)
    )
    env = clean_env(RANKSCOPE_EXPERIMENT=experiment, RANKSCOPE_ENDPOINT=sink.endpoint, RANKSCOPE_SAMPLE_SEED="11")
    _torchrun("reservoir", steps, env, tmp_path)
    sink.finalize(experiment)
    assert sink.wait_written(experiment)
    sink.stop()
    rows = _samples(jsonl, "picks")
    per_step = Counter(row["step"] for row in rows)
    assert set(per_step) == set(range(steps)) and set(per_step.values()) == {4}
    assert all(row["side"] == "sample" and row["row"]["who"] == row["rank"] for row in rows)
    kept = Counter(row["rank"] for row in rows)
    for rank in range(4):
        assert abs(kept[rank] / len(rows) - (rank + 1) / 10) < 0.06, kept
