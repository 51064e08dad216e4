"""Clients nobody here wrote, through real binaries: the OTel Collector's own load generator
(telemetrygen, built from its Go module) and a Prometheus endpoint (prometheus_client, as vLLM
and SGLang serve) scraped by the built Collector's prometheus receiver. Read back from the
sink's JSONL view and status."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from rankscope.sink import BookConfig

from ..pipeline import ROOT, clean_env, collector, free_port

WORKERS = ROOT / "tests" / "workers"


def _steps(path: Path) -> tuple[dict[int, dict[str, float]], list[dict[str, Any]]]:
    steps: dict[int, dict[str, float]] = defaultdict(dict)
    others = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row["kind"] == "global_reduce":
            steps[row["step"]][row["key"]] = row["value"]
        else:
            others.append(row)
    return steps, others


def _telemetrygen(binary: str, signal: str, endpoint: str, *flags: str) -> subprocess.CompletedProcess[str]:
    command = [binary, signal, "--otlp-endpoint", endpoint, "--otlp-insecure", *flags]
    return subprocess.run(command, env=clean_env(), capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.timeout(180)
def test_telemetrygen_metrics_traces_and_logs_land_in_the_views_or_are_refused_with_a_reason(
    binaries, make_sink, tmp_path
) -> None:
    view = tmp_path / "view.jsonl"
    sink = make_sink(
        backends={"jsonl": {"logging_mode": "global_reduce", "path": str(view)}},
        book=BookConfig(time_bucket=1.0, time_bucket_lag=0.5),
    )
    tg, ours = binaries["telemetrygen"], 'rankscope.experiment.id="tg"'
    for signal, flags in (
        ("metrics", ("--metrics", "50", "--metric-type", "Sum", "--otlp-metric-name", "tg_sum")),
        ("metrics", ("--metrics", "30", "--metric-type", "Gauge", "--otlp-metric-name", "tg_gauge")),
        ("metrics", ("--metrics", "20", "--metric-type", "Histogram", "--otlp-metric-name", "tg_hist")),
        (
            "traces",
            (
                "--traces",
                "5",
            ),
        ),
        (
            "logs",
            (
                "--logs",
                "7",
            ),
        ),
    ):
        done = _telemetrygen(tg, signal, sink.endpoint, "--otlp-attributes", ours, "--rate", "100", *flags)
        assert done.returncode == 0, done.stderr[-3000:]
    sink.finalize("tg")
    assert sink.wait_written("tg", timeout=30)
    steps, others = _steps(view)
    keys = {k for v in steps.values() for k in v}
    assert {"tg_sum", "tg_gauge", "tg_gauge/min", "tg_gauge/max", "tg_hist/count", "tg_hist/p99"} <= keys, keys
    assert sum(v.get("tg_hist/count", 0.0) for v in steps.values()) > 0
    status = sink.status("tg")
    assert status["refused_points"] == 0 and status["foreign_points"] == 100
    assert status["log_records"] == 7 and len([r for r in others if r["kind"] == "log"]) == 7
    spans = [json.loads(line) for line in sink.span_rows("tg") or ()]
    assert len(spans) == 10 and all(s["step"] is not None for s in spans)  # 5 traces of 2 spans, none stepped

    # Without an experiment id: refused, with the reason, and counted.
    before = sink.overview()["refused_points"]
    done = _telemetrygen(tg, "metrics", sink.endpoint, "--metrics", "3", "--rate", "100")
    assert "without rankscope.experiment.id" in done.stdout + done.stderr
    assert sink.overview()["refused_points"] == before + 3


@pytest.mark.timeout(180)
def test_a_prometheus_endpoint_scraped_by_the_collector_lands_in_the_experiment(binaries, make_sink, tmp_path) -> None:
    view = tmp_path / "view.jsonl"
    sink = make_sink(
        backends={"jsonl": {"logging_mode": "global_reduce", "path": str(view)}},
        book=BookConfig(time_bucket=1.0, time_bucket_lag=0.5),
    )
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, str(WORKERS / "prometheus_server.py"), str(port)],
        env=clean_env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        env = {
            "RANKSCOPE_SCRAPE_TARGET": f"127.0.0.1:{port}",
            "RANKSCOPE_SCRAPE_INTERVAL": "500ms",
            "RANKSCOPE_EXPERIMENT": "prom",
            "RANKSCOPE_SINK_ENDPOINT": sink.endpoint,
        }
        with collector(binaries["otelcol"], "prometheus", tmp_path, **env):
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                status = sink.status("prom")
                if status is not None and status["last_finalized_step"] >= 3:
                    break
                time.sleep(0.2)
    finally:
        server.kill()
        server.wait(10)
        if server.stdout is not None:
            server.stdout.close()
    sink.finalize("prom")
    assert sink.wait_written("prom", timeout=30)
    steps, _ = _steps(view)
    assert len(steps) >= 3
    tokens = [k for k in steps[max(steps)] if k.startswith("generated_tokens") and "created" not in k]
    assert tokens, steps[max(steps)]
    # Cumulative counters become per-step increases: their sum over the run is the total, once.
    assert sum(v.get(tokens[0], 0.0) for v in steps.values()) == 210.0
    assert all(v["num_requests_running"] == 3.0 for v in steps.values() if "num_requests_running" in v)
    assert sum(v.get("e2e_latency_seconds/count", 0.0) for v in steps.values()) == 40.0
    status = sink.status("prom")
    assert status["processes"] == 1 and status["refused_points"] == 0 and status["time_bucketed"]
