"""A name is not a run: launches of one experiment against a real sink, each a one-process
script (``workers/launch_worker.py``) exporting over loopback, read back from the views' files.

Two launches under one name are two runs, complete and distinct, with and without a sink
restart between them (write-ahead log on); a resumed launch and a Slurm requeue continue their
run and the steps they execute again replace the earlier ones in JSONL, TensorBoard, the
console and the report; W&B gets one run per launch, grouped by the experiment; a resume of an
unknown run is refused with a reason and counted.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rankscope.report.summary import read
from rankscope.sink import BookConfig, Sink

from ..conftest import ROOT
from ..pipeline import clean_env
from ..wandb_file import by_step, run_files, run_record

WORKER = ROOT / "tests" / "workers" / "launch_worker.py"


def launch(sink: Sink, first: int, last: int, tag: int, **env: str) -> str:
    """One launch of experiment ``same``; the run id it was given."""
    done = subprocess.run(
        [sys.executable, str(WORKER), "same", str(first), str(last), str(tag)],
        env=clean_env(RANKSCOPE_ENDPOINT=sink.endpoint, **env),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split("run ", 1)[1].split()[0]


def written(sink: Sink, run: str, step: int) -> dict[str, Any]:
    """The run's status once its views wrote ``step`` (its processes said goodbye: nothing is open)."""
    sink.finalize("same")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status = sink.status("same", run)
        if status is not None and status["last_written_step"] >= step:
            assert sink.wait_written("same", run=run)
            return status
        time.sleep(0.05)
    raise AssertionError(f"run {run} did not write step {step}: {sink.status('same', run)}")


def views(tmp: Path) -> dict[str, dict[str, Any]]:
    return {
        "jsonl": {"logging_mode": "global_reduce", "path": str(tmp / "views.jsonl")},
        "report": {"path": str(tmp / "report" / "{experiment}" / "{run}" / "report.html")},
        "tensorboard": {"logging_mode": "global_reduce", "logdir": str(tmp / "tb")},
        "console": {"logging_mode": "global_reduce"},
    }


def rows(tmp: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp / "views.jsonl").read_text().splitlines()]


def final_values(found: list[dict[str, Any]], run: str, key: str = "loss") -> dict[int, float]:
    """A run's value of ``key`` per step as a JSONL reader keeps it: a rewind row drops what came
    before it for its step and later ones."""
    values: dict[int, float] = {}
    for row in found:
        if row.get("run") != run:
            continue
        if row["kind"] == "rewind":
            values = {s: v for s, v in values.items() if s < row["step"]}
        elif row["kind"] == "global_reduce" and row["key"] == key:
            values[row["step"]] = row["value"]
    return values


@pytest.mark.parametrize("restart", [False, True], ids=["one-sink", "sink-restarted-between"])
def test_two_launches_under_one_name_are_two_complete_runs(make_sink, tmp_path: Path, restart: bool) -> None:
    config = {"backends": views(tmp_path), "state_dir": tmp_path / "state", "book": BookConfig(grace=10.0)}
    sink = make_sink(**config)
    first = launch(sink, 1, 3, tag=1)
    written(sink, first, 3)
    if restart:
        sink.stop()
        sink = make_sink(**config)
    second = launch(sink, 1, 3, tag=2)
    status = written(sink, second, 3)
    sink.stop()

    assert first != second
    assert status["run"] == second and status["processes"] == 1 and status["late_points"] == 0
    assert [r["run"] for r in status["runs"]] == [second, first]  # newest first, the earlier run too
    found = rows(tmp_path)
    assert not [r for r in found if r.get("late")]
    assert final_values(found, first) == {1: 11.0, 2: 21.0, 3: 31.0}
    assert final_values(found, second) == {1: 12.0, 2: 22.0, 3: 32.0}
    for run, tag in ((first, 1), (second, 2)):
        samples = [r for r in found if r["kind"] == "sample" and r["run"] == run]
        assert sorted((s["row"]["step"], s["row"]["tag"]) for s in samples) == [(1, tag), (2, tag), (3, tag)]
        anomalies = [r for r in found if r["kind"] == "anomaly" and r["run"] == run]
        assert [(a["type"], a["step"]) for a in anomalies] == [("nonfinite", 3)]
    for run in (first, second):  # a report page per run, listing the experiment's runs
        summary = read(tmp_path / "report" / "same" / run / "report.jsonl")
        assert summary.run == run and summary.steps == 3
    assert {r["run"] for r in summary.runs} == {first, second}


def test_a_resumed_launch_rewinds_its_run_in_every_view(make_sink, tmp_path: Path, capfd) -> None:
    sink = make_sink(backends=views(tmp_path), state_dir=tmp_path / "state", book=BookConfig(grace=10.0))
    first = launch(sink, 0, 5, tag=1)
    written(sink, first, 5)
    launcher = launch(sink, 3, 7, tag=2, RANKSCOPE_RESUME="1")  # from its checkpoint at step 2
    status = written(sink, first, 7)
    sink.stop()

    final = {0: 1.0, 1: 11.0, 2: 21.0, 3: 32.0, 4: 42.0, 5: 52.0, 6: 62.0, 7: 72.0}
    assert launcher != first and status["run"] == first and status["attempt"] == 1
    assert [r["run"] for r in status["runs"]] == [first]
    assert status["runs"][0]["resumed_by"] == [launcher] and status["late_points"] == 0
    found = rows(tmp_path)
    assert [r["step"] for r in found if r["kind"] == "rewind"] == [3]
    assert final_values(found, first) == final
    samples = {(r["row"]["step"], r["row"]["tag"]) for r in found if r["kind"] == "sample"}
    assert {(3, 2), (4, 2), (5, 2), (7, 2)} <= samples
    assert "=== rewound to step 3:" in capfd.readouterr().out

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(tmp_path / "tb" / "same" / first / "global"))  # TensorBoard's own reader
    board.Reload()
    assert [(e.step, e.value) for e in board.Scalars("loss")] == sorted(final.items())  # purged, then again

    summary = read(tmp_path / "report" / "same" / first / "report.jsonl")
    assert summary.rewinds == [{"step": 3, "from": 5}]
    charts = summary.series
    (series,) = [s for (role, key), s in charts.by_role.items() if key == "loss"] or [charts.globals["loss"]]
    assert [(p[0], p[1]) for p in series.points] == sorted(final.items())


def test_a_slurm_requeue_continues_its_run(make_sink, tmp_path: Path) -> None:
    sink = make_sink(backends=views(tmp_path), book=BookConfig(grace=10.0))
    job = {"SLURM_JOB_ID": "4242", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
    first = launch(sink, 0, 4, tag=1, SLURM_RESTART_COUNT="0", **job)
    written(sink, first, 4)
    again = launch(sink, 2, 5, tag=2, SLURM_RESTART_COUNT="1", **job)  # requeued, from its step-1 checkpoint
    status = written(sink, first, 5)
    sink.stop()
    assert first == again == "slurm-4242" and status["attempt"] >= 1 and len(status["runs"]) == 1
    found = rows(tmp_path)
    assert [r["step"] for r in found if r["kind"] == "rewind"] == [2]
    assert final_values(found, first) == {0: 1.0, 1: 11.0, 2: 22.0, 3: 32.0, 4: 42.0, 5: 52.0}


def test_a_resume_of_an_unknown_run_is_refused_with_a_reason(make_sink, tmp_path: Path) -> None:
    sink = make_sink(backends=views(tmp_path), book=BookConfig(grace=10.0))
    first = launch(sink, 0, 1, tag=1)
    written(sink, first, 1)
    launch(sink, 0, 1, tag=2, RANKSCOPE_RESUME="no-such-run")
    overview = sink.overview()
    sink.stop()
    assert overview["refused_points"] > 0
    assert any("has no run" in why for why in overview["refusals"]), overview["refusals"]  # kinds, not names
    assert any("no-such-run" in note for note in overview["run_notes"])
    assert overview["runs"] == 1  # nothing of it became a run


def test_wandb_gets_one_run_per_launch_in_the_experiments_group(make_sink, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    sink = make_sink(
        backends={"wandb": {"logging_mode": "global_reduce", "dir": str(tmp_path)}}, book=BookConfig(grace=10.0)
    )
    launches = [launch(sink, 0, 2, tag=1, WANDB_MODE="offline"), launch(sink, 0, 2, tag=2, WANDB_MODE="offline")]
    for run in launches:
        written(sink, run, 2)
    sink.stop()
    files = run_files(tmp_path)
    by_run = {}
    for path in files:
        record = run_record(path)
        config = {item.key: json.loads(item.value_json) for item in record.config.update}
        run = config["rankscope.run.id"]
        by_run[run.get("value") if isinstance(run, dict) else run] = (record, by_step([path]))
    assert len(files) == 2 and set(by_run) == set(launches)
    for tag, run in enumerate(launches, start=1):
        record, steps = by_run[run]
        assert record.run_group == "same" and record.display_name == f"same · {run[-8:]}"
        assert [steps[s]["loss"] for s in range(3)] == [tag, 10.0 + tag, 20.0 + tag]
