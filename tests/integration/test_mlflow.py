"""The MLflow view against a real ``mlflow server`` (issue 54): a 2-rank torchrun job lands as one
MLflow run whose every value equals the JSONL view's, two runs of an experiment are two MLflow
runs of one experiment, keys MLflow refuses are mapped, a step over MLflow's batch limits lands
whole, and a server killed and restarted mid-run loses nothing it had room to keep, counting
what it had not.

Each server is ``mlflow server`` on a free loopback port with a SQLite store in the test's
directory, its artifacts proxied by it; it and its workers are one process group, killed at
the end of the test (or of the module, for the shared one)."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ..conftest import ROOT, free_port

mlflow = pytest.importorskip("mlflow")
from mlflow import MlflowClient  # noqa: E402

from rankscope.backends.mlflow.keys import mlflow_key  # noqa: E402
from rankscope.backends.mlflow.rest import cause  # noqa: E402

SCRIPT = ROOT / "examples" / "mytrain.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
MLFLOW = Path(sys.executable).with_name("mlflow")
SINK = {"RANKSCOPE_SINK": "embedded"}
"""A lone process's views run in an embedded sink too, as a torchrun job's do."""


class Server:
    """``mlflow server`` on ``port``, its store and artifacts under ``root``."""

    def __init__(self, root: Path, port: int) -> None:
        self.root, self.port = root, port
        self.uri = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120) -> Server:
        self.root.mkdir(parents=True, exist_ok=True)
        cmd = [str(MLFLOW), "server", "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}"]
        cmd += ["--artifacts-destination", str(self.root / "artifacts"), "--host", "127.0.0.1"]
        cmd += ["--port", str(self.port), "--workers", "1"]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RANKSCOPE_"))}
        with (self.root / "server.log").open("ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=out, env=env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.root / "server.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        raise AssertionError(
            f"mlflow server did not start in {timeout}s: {(self.root / 'server.log').read_text()[-3000:]}"
        )

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        self.proc = None


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    started = Server(tmp_path_factory.mktemp("mlflow"), free_port()).start()
    yield started
    started.kill()


def _env(tmp_path: Path, uri: str, **extra: str) -> dict[str, str]:
    prefixes = ("RANKSCOPE_", "OTEL_", "TORCHELASTIC_", "WANDB_", "MLFLOW_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env.update(RANKSCOPE_RUNTIME_DIR=str(tmp_path / "runtime"), OMP_NUM_THREADS="1", MLFLOW_TRACKING_URI=uri)
    env.update(extra)
    return env


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _jsonl(path: Path) -> dict[str, dict[int, float]]:
    """The global view's values in a run's ``metrics.jsonl``: key → step → value (the last row wins)."""
    values: dict[str, dict[int, float]] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row.get("kind") == "global_reduce" and row.get("step") is not None:
            values.setdefault(row["key"], {})[row["step"]] = row["value"]
    return values


def _history(client: MlflowClient, run_id: str, key: str) -> dict[int, float]:
    """A metric's history, step → value: of a step's values the latest (by timestamp) is final."""
    found: dict[int, tuple[int, float]] = {}
    for m in client.get_metric_history(run_id, key):
        if m.step not in found or m.timestamp >= found[m.step][0]:
            found[m.step] = (m.timestamp, m.value)
    return {step: value for step, (_, value) in found.items()}


def _same(values: dict[int, float]) -> dict[int, Any]:
    return {step: "nan" if math.isnan(value) else value for step, value in values.items()}


def _same_values(client: MlflowClient, run_id: str, expected: dict[str, dict[int, float]]) -> None:
    assert expected
    for key, steps in expected.items():
        assert _same(_history(client, run_id, mlflow_key(key))) == _same(steps), key


def _runs(client: MlflowClient, experiment: str) -> list[Any]:
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no MLflow experiment {experiment!r}"
    return client.search_runs([found.experiment_id], order_by=["attributes.start_time ASC"])


def _only_run(tmp_path: Path, experiment: str) -> Path:
    """The directory of the one run of ``experiment`` that the embedded sink kept."""
    (found,) = (tmp_path / "rankscope_logs" / experiment).glob("*/metrics.jsonl")
    return found.parent


@pytest.mark.timeout(420)
def test_a_torchrun_job_is_one_mlflow_run_and_two_runs_are_two(server: Server, tmp_path: Path) -> None:
    env = _env(tmp_path, server.uri, RANKSCOPE_BACKENDS='{"console": {}, "mlflow": {}}')
    for _ in range(2):
        done = _run([*TORCHRUN, str(SCRIPT), "--steps", "4"], tmp_path, env)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "rankscope: the mlflow view" not in done.stderr, done.stderr[-3000:]  # nothing dropped, nothing off
    dirs = sorted(p.parent for p in (tmp_path / "rankscope_logs" / "mytrain").glob("*/metrics.jsonl"))
    client = MlflowClient(server.uri)
    runs = _runs(client, "mytrain")
    assert len(runs) == 2  # one MLflow experiment, one MLflow run per rankscope run
    for run, run_dir in zip(runs, dirs, strict=True):
        rankscope_run = run_dir.name
        assert run.info.run_name == rankscope_run  # its start time and short id: 20261127-101500-abf76e7e
        assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{8}", rankscope_run)
        assert run.info.status == "FINISHED"
        tags = run.data.tags
        assert tags["rankscope.experiment.id"] == "mytrain" and tags["rankscope.run.id"] == rankscope_run
        assert tags["rankscope.experiment.attempt"] == "0"
        assert tags["rankscope.world_size.trainer"] == "2" and tags["rankscope.processes"] == "2"
        assert run.data.params["trainer/rankscope.world_size"] == "2"  # the compare page's configuration
        expected = _jsonl(run_dir / "metrics.jsonl")
        assert set(expected["loss"]) == {0, 1, 2, 3} and expected["samples"] == dict.fromkeys(range(4), 128.0)
        _same_values(client, run.info.run_id, expected)  # every key, every step: the JSONL view's value
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "rankscope")}
        assert {"rankscope/report.html", "rankscope/status.json"} <= artifacts, artifacts


MANY = """\
import math, rankscope as rs
rs.init()
odd = ["val//acc", "a/./b", "loss-0123456789", "y" * 255, "trailing/"]
for step in range(3):
    for i in range(2500):
        rs.record_metric(f"k/{i:04d}", float(i * 10 + step))
    for j, key in enumerate(odd):
        rs.record_metric(key, float(j + step))
    rs.record_metric("bad", math.nan if step == 1 else 1.0)
    rs.record_sample("completions", {"prompt": f"p{step}", "reward": 0.5 * step})
    rs.flush(step)
rs.shutdown()
"""


@pytest.mark.timeout(300)
def test_mapped_keys_a_step_over_the_limits_anomalies_and_samples(server: Server, tmp_path: Path) -> None:
    (tmp_path / "many.py").write_text(MANY)
    env = _env(tmp_path, server.uri, RANKSCOPE_BACKENDS='{"mlflow": {}}', RANKSCOPE_EXPERIMENT="many-keys", **SINK)
    done = _run([sys.executable, "many.py"], tmp_path, env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rankscope: the mlflow view" not in done.stderr and "refused" not in done.stderr, done.stderr[-3000:]
    client = MlflowClient(server.uri)
    (run,) = _runs(client, "many-keys")
    run_id = run.info.run_id
    expected = _jsonl(_only_run(tmp_path, "many-keys") / "metrics.jsonl")
    assert len([k for k in expected if k.startswith("k/")]) == 2500
    assert len(run.data.metrics) >= 2506  # 2,506 keys in each step: three requests, every key landed
    _same_values(client, run_id, expected)
    # Keys MLflow refuses are mapped to PREFIX-HASH, the map kept as an artifact; the others are as they were.
    odd = ["val//acc", "a/./b", "loss-0123456789", "y" * 255, "trailing/"]
    mapped = {mlflow_key(k): k for k in odd}
    assert all(m != k and re.search(r"-[0-9a-f]{10}$", m) and len(m) <= 250 for m, k in mapped.items())
    assert mlflow_key("k/0001") == "k/0001" and "k/0001" in run.data.metrics
    local = Path(client.download_artifacts(run_id, "rankscope", str(tmp_path / "got")))
    assert json.loads((local / "keys.json").read_text()) == mapped
    assert run.data.tags["rankscope.keys_mapped"] == "5"
    # The anomaly record (the NaN at step 1) and the sample table's rows are artifacts, as JSON lines.
    anomalies = [json.loads(line) for line in (local / "anomalies.jsonl").read_text().splitlines()]
    assert any(a["type"] == "nonfinite" and a["step"] == 1 for a in anomalies), anomalies
    assert run.data.tags["rankscope.anomalies"] == str(len(anomalies))
    samples = [json.loads(line) for line in (local / "samples" / "completions.jsonl").read_text().splitlines()]
    assert sorted(s["row"]["prompt"] for s in samples) == ["p0", "p1", "p2"]
    assert _same(_history(client, run_id, "bad")) == {0: 1.0, 1: "nan", 2: 1.0}


OUTAGE = """\
import os, sys, time, rankscope as rs
rs.init()
step, restarted_at = 0, None
while True:
    for i in range(10):
        rs.record_metric(f"v{i}", float(step * 100 + i))
    rs.flush(step)
    if restarted_at is None and os.path.exists("restarted"):
        restarted_at = step
        open("restarted_at", "w").write(str(step))
    if restarted_at is not None and step >= restarted_at + 10:
        break
    step += 1
    time.sleep(0.1)
rs.shutdown()
"""


@pytest.mark.timeout(420)
def test_a_server_killed_and_restarted_mid_run(tmp_path: Path) -> None:
    served = Server(tmp_path / "server", free_port()).start()
    try:
        (tmp_path / "outage.py").write_text(OUTAGE)
        views = {"mlflow": {"max_buffered": 200, "max_backoff": 1.0, "timeout": 2}}
        env = _env(tmp_path, served.uri, RANKSCOPE_BACKENDS=json.dumps(views), RANKSCOPE_EXPERIMENT="outage", **SINK)
        job = subprocess.Popen(
            [sys.executable, "outage.py"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            client = MlflowClient(served.uri)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:  # the run's first steps are in MLflow: then the server dies
                runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
                if runs and len(client.get_metric_history(runs[0].info.run_id, "v0")) >= 3:
                    break
                time.sleep(0.5)
            else:
                raise AssertionError("the run's first steps never reached MLflow")
            served.kill()
            time.sleep(3)  # the job goes on meanwhile: its view buffers, then drops, and the sink never waits
            served.start()
            (tmp_path / "restarted").touch()
            _, err = job.communicate(timeout=180)
        finally:
            if job.poll() is None:
                job.kill()
                job.communicate()
        assert job.returncode == 0, err[-3000:]
        restarted_at = int((tmp_path / "restarted_at").read_text())
        assert len(re.findall(r"MLflow at \S+ does not answer", err)) == 1, err[-3000:]  # said once
        assert len(re.findall(r"MLflow at \S+ answers again", err)) == 1, err[-3000:]
        expected = _jsonl(_only_run(tmp_path, "outage") / "metrics.jsonl")
        (run,) = client.search_runs([client.get_experiment_by_name("outage").experiment_id])
        last = max(expected["v0"])
        missing = 0
        for key, steps in expected.items():
            got = _history(client, run.info.run_id, mlflow_key(key))
            assert all(got[s] == v for s, v in steps.items() if s in got), key  # what landed is right
            missing += sum(1 for s in steps if s not in got)
            if key.startswith("v"):  # every value from the restart on is there
                lost = [s for s in range(restarted_at, last + 1) if s not in got]
                assert not lost, (key, restarted_at, last, lost, err[-3000:])
        dropped = re.findall(r"dropped (\d+) entries \((\d+) metric points\)", err)
        said = int(dropped[-1][1]) if dropped else 0
        assert missing == said, (missing, said, err[-3000:])  # each point missing is one counted as dropped
        assert said > 0, "a 200-entry buffer held the whole outage: the drop path went untested"
        print(f"outage: restarted at step {restarted_at}, last step {last}, {said} metric points dropped and counted")
    finally:
        served.kill()


ROLE = """\
import os, rankscope as rs
rs.init()  # experiment, role, replica, run id and endpoint: RANKSCOPE_*
role, replica = os.environ["RANKSCOPE_ROLE"], int(os.environ.get("RANKSCOPE_REPLICA", "0"))
for step in range(4):
    if role == "trainer":
        rs.record_metric("trainer/loss", 1.0 / (step + 1) + replica)
    else:
        rs.record_metric("generator/reward", 0.5 * step)
        rs.record_sample("rollouts", {"prompt": f"p{step}", "reward": 0.5 * step})
    rs.record_metric("tokens", 10 * (replica + 1), rs.Reduce.SUM)
    rs.flush(step)
rs.shutdown()
"""


def _per_process(path: Path) -> dict[str, dict[str, dict[int, float]]]:
    """A per-process JSONL view: process label -> key -> step -> value."""
    found: dict[str, dict[str, dict[int, float]]] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        found.setdefault(row["process"], {}).setdefault(row["key"], {})[row["step"]] = row["value"]
    return found


@pytest.mark.timeout(300)
def test_a_two_role_job_is_one_mlflow_run_with_a_child_run_per_process_when_asked(
    server: Server, make_sink: Any, tmp_path: Path
) -> None:
    """An RL-shaped job (two trainer replicas and a generator, started apart, one run id) is one
    MLflow run whose values are the global JSONL view's; with a per-process mlflow view beside it,
    each process is a child run of it holding that process's own values."""
    views = {
        "global": {"backend": "jsonl", "path": str(tmp_path / "global.jsonl")},
        "ranks": {"backend": "jsonl", "logging_mode": "per_rank_reduce", "path": str(tmp_path / "ranks.jsonl")},
        "mlflow": {"tracking_uri": server.uri},
        "mlflow_ranks": {"backend": "mlflow", "logging_mode": "per_rank_reduce", "tracking_uri": server.uri},
    }
    sink = make_sink(backends=views)
    base = {"RANKSCOPE_ENDPOINT": sink.endpoint, "RANKSCOPE_EXPERIMENT": "rl-mlflow", "RANKSCOPE_RUN_ID": "job-7"}
    procs = []
    for role, replica in (("trainer", "0"), ("trainer", "1"), ("generator", "0")):
        env = {**_env(tmp_path, server.uri), **base, "RANKSCOPE_ROLE": role, "RANKSCOPE_REPLICA": replica}
        procs.append(subprocess.Popen([sys.executable, "-c", ROLE], env=env, cwd=tmp_path))
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not ((s := sink.status("rl-mlflow")) and s["last_written_step"] == 3):
        time.sleep(0.1)
    sink.stop()  # the views finish: the runs are marked finished

    client = MlflowClient(server.uri)
    runs = _runs(client, "rl-mlflow")
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1, [r.data.tags for r in runs]
    parent = parents[0]
    assert parent.data.tags["rankscope.run.id"] == "job-7" and parent.info.status == "FINISHED"
    assert parent.data.tags["rankscope.processes"] == "3"
    expected = _jsonl(tmp_path / "global.jsonl")
    assert expected["tokens"] == dict.fromkeys(range(4), 40.0)  # 10 + 20 + 10: both roles, summed
    assert set(expected["trainer/loss"]) == set(expected["generator/reward"]) == {0, 1, 2, 3}
    _same_values(client, parent.info.run_id, expected)
    # The per-process view: a child run per process, under the job's run, each with its own values.
    own = _per_process(tmp_path / "ranks.jsonl")
    assert len(own) == 3 and len(children) == 3, (sorted(own), [c.data.tags for c in children])
    for child in children:
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        process = child.data.tags["rankscope.process"]
        _same_values(client, child.info.run_id, own[process])
    trainer = next(c for c in children if c.data.tags["rankscope.process"].startswith("trainer_1"))
    assert _history(client, trainer.info.run_id, "trainer/loss") == {s: 1.0 / (s + 1) + 1 for s in range(4)}


def test_a_server_that_does_not_answer_is_said_in_a_line() -> None:
    wrapped = (
        "API request to http://127.0.0.1:5000/api/2.0/mlflow/runs/log-batch failed with exception "
        "HTTPConnectionPool(host='127.0.0.1', port=5000): Max retries exceeded with url: "
        "/api/2.0/mlflow/runs/log-batch (Caused by NewConnectionError('<urllib3.connection.HTTPConnection "
        "object at 0x7f0>: Failed to establish a new connection: [Errno 111] Connection refused'))"
    )
    assert cause(Exception(wrapped)) == "[Errno 111] Connection refused"
    assert (
        cause(Exception("HTTPConnectionPool(host='h', port=1): Read timed out. (read timeout=2)")) == "Read timed out"
    )
    assert cause(ValueError("x" * 500)) == "ValueError: " + "x" * 160


LONE = """\
import rankscope as rs
for step in range(3):
    rs.record_metric("loss", 1.0 / (step + 1))
    rs.flush(step)
"""


def test_a_wrong_address_is_said_once_in_a_line_and_the_job_finishes(server: Server, tmp_path: Path) -> None:
    """A path that is not the tracking server's answers a web page (404): it is named, once, not
    printed at every retry; an address without ``http://`` is told the scheme it lacks."""
    (tmp_path / "lone.py").write_text(LONE)
    views = '{"console": {}, "mlflow": {"finish_timeout": 3}}'
    wrong = f"{server.uri}/mlflow"
    done = _run([sys.executable, "lone.py"], tmp_path, _env(tmp_path, wrong, RANKSCOPE_BACKENDS=views, **SINK))
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    assert "<html" not in said.lower() and "doctype" not in said.lower(), said[-3000:]
    page = f"a web page, not MLflow's API: is {wrong} the tracking server's address?"
    refusals = [line for line in said.splitlines() if "the mlflow view of" in line and page in line]
    assert len(refusals) == 2, said[-3000:]  # said when it came, and in the count of what was dropped
    assert "dropped" in refusals[1] and "dropped" not in refusals[0], refusals

    bare = f"127.0.0.1:{server.port}"
    done = _run([sys.executable, "lone.py"], tmp_path, _env(tmp_path, bare, RANKSCOPE_BACKENDS=views, **SINK))
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"the tracking URI '{bare}' has no scheme. Fix: MLFLOW_TRACKING_URI=http://{bare}" in done.stderr, (
        done.stderr[-3000:]
    )
