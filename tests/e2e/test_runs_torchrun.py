"""A torchrun elastic restart inside one run: rank 1 dies, torchrun (``--max-restarts 1``)
starts both ranks again as attempt 1 (same run id), and they resume from a checkpoint step. The
run ends with the final timeline: every step once, the re-executed ones from attempt 1, sample
rows included, in JSONL and the report."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from rankscope.report.summary import read
from rankscope.sink import BookConfig

from ..conftest import ROOT
from ..pipeline import clean_env

STEPS, CHECKPOINT, DIE_AFTER = 8, 2, 5


def test_an_elastic_restart_ends_with_the_final_timeline(make_sink, tmp_path: Path) -> None:
    views = {
        "jsonl": {"logging_mode": "global_reduce", "path": str(tmp_path / "views.jsonl")},
        "report": {"path": str(tmp_path / "report.html")},
    }
    sink = make_sink(backends=views, book=BookConfig(grace=30.0))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    command += ["--max-restarts=1", "--monitor-interval=0.5"]
    command += [str(ROOT / "tests" / "workers" / "elastic_worker.py"), str(STEPS), str(CHECKPOINT), str(DIE_AFTER)]
    env = clean_env(RANKSCOPE_EXPERIMENT="elastic", RANKSCOPE_ENDPOINT=sink.endpoint)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (sink.status("elastic") or {}).get("last_written_step") != STEPS - 1:
        time.sleep(0.1)
    status = sink.status("elastic")
    assert status is not None and status["attempt"] == 1 and len(status["runs"]) == 1, status
    sink.stop()

    final = {s: 10.0 * s + (0 if s <= CHECKPOINT else 1) + 0.5 for s in range(STEPS)}  # mean over ranks 0, 1
    rows = [json.loads(line) for line in (tmp_path / "views.jsonl").read_text().splitlines()]
    values: dict[int, float] = {}
    samples: dict[int, set[int]] = {}
    for row in rows:  # as a reader of the file keeps it: a rewind drops what came before it
        if row["kind"] == "rewind":
            values = {s: v for s, v in values.items() if s < row["step"]}
            samples = {s: a for s, a in samples.items() if s < row["step"]}
        elif row["kind"] == "global_reduce" and row["key"] == "loss":
            values[row["step"]] = row["value"]
        elif row["kind"] == "sample":
            samples.setdefault(row["step"], set()).add(row["row"]["attempt"])
    assert [r["step"] for r in rows if r["kind"] == "rewind"] == [CHECKPOINT + 1]
    assert values == final
    assert samples == {s: {0 if s <= CHECKPOINT else 1} for s in range(STEPS)}
    assert not [r for r in rows if r.get("late")]

    summary = read(tmp_path / "report.jsonl")
    charts = summary.series
    series = charts.globals.get("loss") or next(s for (_, key), s in charts.by_role.items() if key == "loss")
    assert [(p[0], p[1]) for p in series.points] == sorted(final.items())
