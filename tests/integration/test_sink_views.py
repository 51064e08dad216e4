"""Views through one sink: several roles and experiments that never mix, a sink restart that resumes
the same W&B run, and per-rank series beyond 64 processes — read back from W&B's own files."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from rankscope.backends.wandb import run_id_for
from rankscope.sink import BookConfig

from ..conftest import ROOT, free_port
from ..wandb_file import by_step, run_files, run_id

ROLE_PROCESS = """
import os, rankscope as rs
rs.init()
for step in range(2):
    rs.record_metric(os.environ["KEY"], float(os.environ["VALUE"]) + step, rs.Reduce.MEAN)
    rs.flush(step)
rs.shutdown()
"""


def test_roles_share_one_run_and_experiments_never_mix(make_sink, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    sink = make_sink(
        backends={"wandb": {"logging_mode": "global_reduce", "dir": str(tmp_path)}}, book=BookConfig(grace=20)
    )
    # processes of one job started apart (no launcher between them): the job names its run
    base = {"RANKSCOPE_ENDPOINT": sink.endpoint, "WANDB_MODE": "offline", "RANKSCOPE_RUN_ID": "job-1"}
    jobs = [
        ("rl", "trainer", None, "loss", 1.0),
        ("rl", "generator", "0", "tokens_per_s", 100.0),
        ("rl", "generator", "1", "tokens_per_s", 300.0),
        ("other", "trainer", None, "loss", 50.0),
    ]
    procs = []
    for experiment, role, replica, key, value in jobs:
        env = {**base, "RANKSCOPE_EXPERIMENT": experiment, "RANKSCOPE_ROLE": role, "KEY": key, "VALUE": str(value)}
        if replica is not None:
            env["RANKSCOPE_REPLICA"] = replica
        full = {k: v for k, v in os.environ.items() if not k.startswith("RANKSCOPE_")} | env
        procs.append(subprocess.Popen([sys.executable, "-c", ROLE_PROCESS], env=full, cwd=ROOT))
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not all(
        (s := sink.status(e)) and s["last_written_step"] == 1 for e in ("rl", "other")
    ):
        time.sleep(0.1)
    sink.stop()

    files = {run_id(p): p for p in run_files(tmp_path)}
    assert set(files) == {run_id_for("rl", "job-1"), run_id_for("other", "job-1")}
    rl = by_step([files[run_id_for("rl", "job-1")]])
    assert rl[1]["loss"] == 2.0 and rl[1]["tokens_per_s"] == 201.0  # the two generators, reduced
    assert rl[1]["trainer/r0/loss"] == 2.0
    assert rl[1]["generator/0/r0/tokens_per_s"] == 101.0 and rl[1]["generator/1/r0/tokens_per_s"] == 301.0
    other = by_step([files[run_id_for("other", "job-1")]])
    assert other[1]["loss"] == 51.0 and "tokens_per_s" not in other[1]


RESTART_PROCESS = """
import os, sys, time, rankscope as rs
rs.init(experiment="restart", endpoint=os.environ["SINK"], export_interval=0.2)
for step in range(4):
    rs.record_metric("loss", float(step))
    rs.flush(step)
    rs.force_flush(2)
    if step == 1:
        print("HALF", flush=True)
        sys.stdin.readline()  # the test restarts the sink here
rs.shutdown()
"""


def test_sink_restart_resumes_the_same_wandb_run(make_sink, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    port = free_port()
    views = {"wandb": {"logging_mode": "global_reduce", "dir": str(tmp_path)}}
    first = make_sink(grpc_port=port, backends=views, book=BookConfig(grace=20))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSCOPE_")} | {"SINK": f"127.0.0.1:{port}"}
    command = [sys.executable, "-c", RESTART_PROCESS]
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}
    with subprocess.Popen(command, env=env, cwd=ROOT, **pipes) as client:  # type: ignore[call-overload]
        assert client.stdout is not None and client.stdin is not None
        assert client.stdout.readline().strip() == "HALF"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (first.status("restart") or {}).get("last_written_step") != 1:
            time.sleep(0.05)
        first.stop()
        second = make_sink(grpc_port=port, backends=views, book=BookConfig(grace=20))
        client.stdin.write("\n")
        client.stdin.flush()
        assert client.wait(timeout=60) == 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (second.status("restart") or {}).get("last_written_step") != 3:
        time.sleep(0.05)
    second.stop()
    files = run_files(tmp_path)
    runs = {run_id(p) for p in files}
    assert len(files) == 2 and len(runs) == 1 and runs.pop().startswith("restart-")  # resumed, not a new run
    rows = by_step(files)
    assert sorted(rows) == [0, 1, 2, 3] and [rows[s]["loss"] for s in range(4)] == [0.0, 1.0, 2.0, 3.0]


def test_per_rank_series_beyond_64_processes_only_for_allowlisted_keys(make_sink, tmp_path: Path, monkeypatch) -> None:
    """At 70 processes a W&B run gets per-rank series only for ``per_rank_keys`` (a 1,000-rank job
    would otherwise put 1,000 series per key in one run); the global values are all there."""
    from .test_sink_hostile import Http
    from .test_sink_tenants import _stepped

    monkeypatch.setenv("WANDB_MODE", "offline")
    view = {"logging_mode": "global_reduce", "dir": str(tmp_path), "per_rank_keys": ["k0"]}
    sink = make_sink(backends={"wandb": view}, book=BookConfig(grace=30))
    conn = Http(sink.http_port)
    ranks = 70
    for rank in range(ranks):
        assert conn.export(_stepped("wide", f"p{rank}", 0, rank, ranks, keys=2))[:2] == (200, 0)
    conn.close()
    assert sink.wait_written("wide")
    sink.stop()
    row = by_step(run_files(tmp_path))[0]
    assert row["k0"] == row["k1"] == float(ranks - 1)  # MAX over the ranks
    per_rank = {k for k in row if re.fullmatch(r"\w+/r\d+/k\d", k)}
    assert {k.rsplit("/", 1)[1] for k in per_rank} == {"k0"}, sorted(per_rank)[:5]
    assert len(per_rank) == ranks


ORDERED_PROCESS = """
import rankscope as rs
rs.init()
for step in range(2):
    rs.record_metric("loss", 1.0 + step)                     # MEAN
    rs.record_metric("grad_norm", 3.0, rs.Reduce.MAX)      # MAX, between two MEAN keys
    rs.record_metric("accuracy", 0.5)                       # MEAN again
    rs.record_metric("tokens", 7.0, rs.Reduce.SUM)
    rs.flush(step)
rs.shutdown()
"""


def test_a_steps_keys_reach_the_views_in_the_order_they_were_first_recorded(make_sink) -> None:
    """The sink checks a request's points by reduce type; the views still list the keys as the
    process first recorded them (a newcomer's ``loss`` first, not after every other MEAN key)."""
    sink = make_sink(backends={})
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSCOPE_")}
    env |= {"RANKSCOPE_ENDPOINT": sink.endpoint, "RANKSCOPE_EXPERIMENT": "ordered", "RANKSCOPE_RUN_ID": "r"}
    assert subprocess.run([sys.executable, "-c", ORDERED_PROCESS], env=env, cwd=ROOT, timeout=120).returncode == 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(sink.queries.recent("ordered") or []) < 2:
        time.sleep(0.1)
    for step in sink.queries.recent("ordered") or []:
        users = [k for k in step["values"] if k.split("/")[0] in ("loss", "grad_norm", "accuracy", "tokens")]
        assert [k.split("/")[0] for k in users if "/" not in k] == ["loss", "grad_norm", "accuracy", "tokens"]
    assert len(sink.queries.recent("ordered") or []) == 2


BAD_VIEW_PROCESS = """
import rankscope as rs
rs.init()
for step in range(3):
    rs.record_metric("loss", 1.0 + step)
    rs.flush(step)
rs.shutdown()
"""


def test_a_bad_view_is_off_in_one_line_and_the_runs_other_views_are_whole(make_sink, tmp_path: Path, caplog) -> None:
    """A view the sink cannot make (a backend unknown to it: a client of a newer version, a typo in a
    config the sink was given programmatically) is off from the start, said in one line naming it,
    never as an internal error; the run's other views get every step."""
    out = tmp_path / "global.jsonl"
    views = {"consle": {}, "jsonl": {"logging_mode": "global_reduce", "path": str(out)}}
    sink = make_sink(backends=views, book=BookConfig(grace=20))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSCOPE_")}
    env.update(RANKSCOPE_ENDPOINT=sink.endpoint, RANKSCOPE_EXPERIMENT="bad-view", RANKSCOPE_RUN_ID="job-1")
    with caplog.at_level("INFO", logger="rankscope.sink"):
        done = subprocess.run([sys.executable, "-c", BAD_VIEW_PROCESS], env=env, cwd=tmp_path, timeout=120)
        assert done.returncode == 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (sink.status("bad-view") or {}).get("last_written_step") != 2:
            time.sleep(0.1)
        status = sink.status("bad-view") or {}
    assert [json.loads(line)["value"] for line in out.read_text().splitlines() if '"loss"' in line] == [1.0, 2.0, 3.0]
    off = status["views"]["consle"]
    assert off["disabled"] and off["last_error"].startswith("view 'consle': unknown backend 'consle'"), off
    said = [r.getMessage() for r in caplog.records if "consle" in r.getMessage()]
    assert len(said) == 1 and "is off: view 'consle': unknown backend 'consle'" in said[0], said
    assert "Traceback" not in caplog.text and "internal error" not in caplog.text
