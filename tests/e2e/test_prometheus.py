"""The merged series in Prometheus (issue 54): a 2-rank torchrun job's global view, sent by the
``otlp`` view through the built Collector (``collector-config/remote-write.yaml``, the
``prometheusremotewrite`` exporter) into a real Prometheus (Debian's, its remote-write receiver
on), read back with the Grafana dashboard's own queries (``collector-config/grafana/rankscope.json``).

Every loss value Prometheus holds equals the JSONL view's at the same step (the step joined
through the ``rankscope_step`` series at the same sample time); every panel's query finds its
series. The Collector starts only after the job has begun: the view holds the steps and sends them
when it answers, none lost. Prometheus, the Collector and the job are killed with their process
groups at the end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from ..conftest import ROOT, free_port
from ..pipeline import Process, clean_env, collector, jsonl_rows, wait_http

DASHBOARD = ROOT / "collector-config" / "grafana" / "rankscope.json"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
STEPS = 12


class Prometheus:
    """``prometheus`` on a free loopback port, its remote-write receiver on, its data under ``root``."""

    def __init__(self, root: Path) -> None:
        self.port = free_port()
        (root / "prometheus.yml").write_text("global:\n  scrape_interval: 15s\n")
        self.process = Process(
            [
                "/usr/bin/prometheus",
                f"--config.file={root / 'prometheus.yml'}",
                f"--storage.tsdb.path={root / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-remote-write-receiver",
            ],
            clean_env(),
            root / "prometheus.log",
        )
        wait_http(f"http://127.0.0.1:{self.port}/-/ready", timeout=60, proc=self.process)
        self.write_url = f"http://127.0.0.1:{self.port}/api/v1/write"

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as answer:
            body = json.load(answer)
        assert body["status"] == "success", body
        return body["data"]["result"]  # type: ignore[no-any-return]


@pytest.fixture
def prometheus(prometheus_ready: None, tmp_path: Path) -> Iterator[Prometheus]:
    (tmp_path / "prom").mkdir()
    found = Prometheus(tmp_path / "prom")
    try:
        yield found
    finally:
        found.process.stop()


def _queries(experiment: str) -> dict[str, str]:
    """Each panel's query of the dashboard, for one experiment and every run."""
    dashboard = json.loads(DASHBOARD.read_text())
    return {
        panel["title"]: target["expr"].replace("$experiment", experiment).replace("$run", ".*")
        for panel in dashboard["panels"]
        for target in panel["targets"]
    }


def _samples(prometheus: Prometheus, expr: str) -> dict[int, float]:
    """Sample time (ms) -> value of the one series ``expr`` selects, every sample of the last hour."""
    found = prometheus.query(f"{expr}[1h]")
    assert len(found) == 1, found
    return {round(float(t) * 1000): float(v) for t, v in found[0]["values"]}


@pytest.mark.timeout(300)
def test_the_merged_series_land_in_prometheus_as_the_dashboard_queries_them(
    binaries: dict[str, str], prometheus: Prometheus, tmp_path: Path
) -> None:
    grpc_port = free_port()
    views = {
        "console": {},
        "jsonl": {"path": str(tmp_path / "global.jsonl")},
        "otlp": {"endpoint": f"http://127.0.0.1:{grpc_port}"},
    }
    env = clean_env(RANKSCOPE_BACKENDS=json.dumps(views), RANKSCOPE_EXPERIMENT="prom-e2e")
    errors = (tmp_path / "job.err").open("w")
    job = subprocess.Popen(
        [*TORCHRUN, str(ROOT / "examples" / "mytrain.py"), "--steps", str(STEPS)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=errors,
        text=True,
        start_new_session=True,
    )
    try:
        _check(job, errors, binaries, prometheus, tmp_path, grpc_port)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(30)


def _check(
    job: subprocess.Popen[str],
    errors: IO[str],
    binaries: dict[str, str],
    prometheus: Prometheus,
    tmp_path: Path,
    grpc_port: int,
) -> None:
    lines: list[str] = []
    held = threading.Event()

    def read() -> None:
        assert job.stdout is not None
        for line in job.stdout:
            lines.append(line)
            if line.startswith(f"step {STEPS // 2} "):
                held.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    # No Collector until half the steps are out: the view holds them and sends them when it answers.
    assert held.wait(180), "".join(lines)[-2000:]
    with collector(
        binaries["otelcol"],
        "remote-write",
        tmp_path,
        OTLP_GRPC_ENDPOINT=f"127.0.0.1:{grpc_port}",
        RANKSCOPE_REMOTE_WRITE_URL=prometheus.write_url,
    ):
        job.wait(120)
        reader.join(10)
        assert job.stdout is not None
        job.stdout.close()
        errors.close()
        stderr = (tmp_path / "job.err").read_text()
        assert job.returncode == 0, stderr[-3000:]
        rows = [r for r in jsonl_rows(tmp_path / "global.jsonl") if not r.get("late")]
        run = rows[0]["run"]
        queries = _queries("prom-e2e")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the Collector batches; Prometheus takes it within seconds
            last = prometheus.query(queries["Step"])
            if last and float(last[0]["value"][1]) == STEPS - 1:
                break
            time.sleep(0.5)
        assert last and float(last[0]["value"][1]) == STEPS - 1, (last, stderr[-2000:])

    down = [line for line in stderr.splitlines() if "does not answer" in line and "otlp view" in line]
    assert len(down) == 1 and "keeps up to 600 steps and retries" in down[0], stderr[-3000:]  # said once
    assert "answers again" in stderr, stderr[-3000:]
    assert last[0]["metric"]["run"] == run and last[0]["metric"]["experiment"] == "prom-e2e"
    # Every step's loss, exactly the JSONL view's, joined by the step series' sample at the same time.
    steps = _samples(prometheus, f'rankscope_step{{key="", experiment="prom-e2e", run="{run}"}}')
    losses = _samples(prometheus, queries["Loss"])
    assert sorted(steps.values()) == [float(s) for s in range(STEPS)]  # every step, none twice
    by_step = {int(steps[t]): value for t, value in losses.items()}
    expected = {r["step"]: r["value"] for r in rows if r["key"] == "loss"}
    assert by_step == expected
    loss = prometheus.query(queries["Loss"])[0]["metric"]
    assert (loss["__name__"], loss["key"], loss["role"]) == ("rankscope_loss", "loss", "trainer")
    assert "step" not in loss  # the step is a series of its own, never a label
    assert (loss["job"], loss["otel_scope_name"]) == ("rankscope-sink", "rankscope"), loss  # docs/prometheus.md
    # Every panel's query finds its series: step time, stragglers (when and who), missing processes.
    for title, expr in queries.items():
        assert prometheus.query(expr), (title, expr)
    missing = prometheus.query(queries["Missing processes"])
    assert [float(m["value"][1]) for m in missing] == [0.0]
    stragglers = queries["Stragglers: how late the last process arrived, per phase"]
    late = {m["metric"]["key"] for m in prometheus.query(stragglers)}
    assert "straggler/train/late_s" in late, late
    seconds = _samples(prometheus, queries["Step time"])
    assert len(seconds) >= STEPS - 1 and all(0 < s < 30 for s in seconds.values()), seconds
