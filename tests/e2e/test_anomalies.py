"""Anomalies caught where they happen (issue 17): non-finite provenance and per-step detectors,
over real torchrun ranks into a real sink, read back from its JSONL view and status route."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from rankscope.sink import BookConfig

from ..conftest import ROOT
from ..pipeline import clean_env

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
    sink = make_sink(
        backends={"jsonl": {"logging_mode": "global_reduce", "path": str(path)}}, book=BookConfig(grace=30)
    )
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


def _trace_steps(path: str) -> int:
    """``rankscope.step N`` ranges in a gzipped Chrome trace: how many steps it profiled."""
    events = json.loads(gzip.decompress(Path(path).read_bytes()))["traceEvents"]
    return len({e["name"] for e in events if str(e.get("name", "")).startswith("rankscope.step ")})


def test_a_straggler_is_named_and_profiled_on_its_rank_only(make_sink, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")  # W&B's process-wide settings are made once, from the env
    path = tmp_path / "global.jsonl"
    views = {
        "jsonl": {"logging_mode": "global_reduce", "path": str(path)},
        "wandb": {"logging_mode": "global_reduce", "dir": str(tmp_path), "mode": "offline"},
    }
    sink = make_sink(backends=views, artifacts_dir=tmp_path / "artifacts", book=BookConfig(grace=30))
    control = f"http://127.0.0.1:{sink.http_port}"
    env = clean_env(
        RANKSCOPE_EXPERIMENT="slow",
        RANKSCOPE_ENDPOINT=sink.endpoint,
        RANKSCOPE_SINK_CONTROL=control,
        WANDB_MODE="offline",
    )
    _torchrun("straggler", 20, env, tmp_path)
    sink.finalize("slow")
    assert sink.wait_written("slow")
    spans = sink.spans("slow") or []
    sink.stop()
    rows = _rows(path)
    stragglers = [r for r in rows if r["kind"] == "anomaly" and r["type"] == "straggler"]
    assert stragglers and min(r["step"] for r in stragglers) == 5
    assert {(r["process"], r["rank"]) for r in stragglers} == {("trainer_r1", 1)}
    assert "train/fwd" in {r["phase"] for r in stragglers} or "fwd" in {r["phase"] for r in stragglers}
    asked = {r["capture"] for r in stragglers if "capture" in r}
    assert len(asked) == 1  # one capture: a detector that keeps firing asks once per interval
    (capture,) = [r for r in rows if r["kind"] == "anomaly" and r["type"] == "capture"]
    assert capture["capture"] in asked and (capture["process"], capture["rank"]) == ("trainer_r1", 1)
    assert Path(capture["path"]).is_file() and _trace_steps(capture["path"]) == 2
    assert len(list((tmp_path / "artifacts").rglob("*.gz"))) == 1  # that rank only
    (event,) = [s for s in spans if s.name == "rankscope.capture" and s.process.rank == 1]  # marked in its trace
    assert (tmp_path / "artifacts" / event.attributes["rankscope.capture.file"]) == Path(capture["path"])
    assert list(tmp_path.glob("wandb/*/files/**/trainer_r1.pt.trace.json.gz"))  # one of the W&B run's files


def test_rankscope_capture_profiles_exactly_the_asked_ranks_and_steps(make_sink, tmp_path: Path) -> None:
    import time

    sink = make_sink(artifacts_dir=tmp_path / "artifacts", auto_capture_steps=0, book=BookConfig(grace=30))
    control = f"http://127.0.0.1:{sink.http_port}"
    env = clean_env(RANKSCOPE_EXPERIMENT="asked", RANKSCOPE_ENDPOINT=sink.endpoint, RANKSCOPE_SINK_CONTROL=control)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4", WORKER, "steady", "80"]
    job = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while (sink.status("asked") or {}).get("last_finalized_step", -1) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        cli = [sys.executable, "-m", "rankscope.cli", "capture", "--sink", control, "--experiment", "asked"]
        done = subprocess.run(
            [*cli, "--ranks", "0,2", "--steps", "3", "--wait", "60"], capture_output=True, text=True, timeout=90
        )
        assert done.returncode == 0, done.stderr
        _, stderr = job.communicate(timeout=120)
        assert job.returncode == 0, stderr[-3000:]
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    printed = dict(line.split("\t") for line in done.stdout.splitlines())
    assert sorted(printed) == ["trainer_r0", "trainer_r2"], done.stdout
    assert all(_trace_steps(p) == 3 for p in printed.values())
    assert sorted(p.name for p in (tmp_path / "artifacts").rglob("*.gz")) == [
        "trainer_r0.pt.trace.json.gz",
        "trainer_r2.pt.trace.json.gz",
    ]


def test_a_process_asks_for_a_capture_of_itself(make_sink, tmp_path: Path) -> None:
    sink = make_sink(artifacts_dir=tmp_path / "artifacts", auto_capture_steps=0, book=BookConfig(grace=30))
    control = f"http://127.0.0.1:{sink.http_port}"
    env = clean_env(RANKSCOPE_EXPERIMENT="self", RANKSCOPE_ENDPOINT=sink.endpoint, RANKSCOPE_SINK_CONTROL=control)
    _torchrun("self", 60, env, tmp_path)
    (capture,) = sink.status("self")["captures"]
    assert capture["reason"] == "rank 3 wants a look" and capture["ranks"] == [3] and capture["steps"] == 1
    assert list(capture["files"]) == ["trainer_r3"] and _trace_steps(capture["files"]["trainer_r3"]) == 1


def test_a_capture_of_the_jobs_last_step_is_sent_at_shutdown(make_sink, tmp_path: Path) -> None:
    """The job ends at the flush that stops rank 3's profiler: the trace is written and sent
    by ``rs.shutdown`` (which waits for the upload), not lost with the process."""
    sink = make_sink(artifacts_dir=tmp_path / "artifacts", auto_capture_steps=0, book=BookConfig(grace=30))
    control = f"http://127.0.0.1:{sink.http_port}"
    env = clean_env(RANKSCOPE_EXPERIMENT="last", RANKSCOPE_ENDPOINT=sink.endpoint, RANKSCOPE_SINK_CONTROL=control)
    _torchrun("last", 60, env, tmp_path)
    (capture,) = sink.status("last")["captures"]
    assert capture["ranks"] == [3] and capture["taken"] == 1
    assert list(capture["files"]) == ["trainer_r3"] and _trace_steps(capture["files"]["trainer_r3"]) == 1
    assert (sink.status("last") or {}).get("last_finalized_step", 60) < 59  # it ended early, as meant
