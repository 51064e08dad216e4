"""Plain OpenTelemetry clients land in the experiment: a real OTel SDK program (Counter,
Histogram, UpDownCounter, observable Gauge, spans, logs) with nothing of rankscope in it, two
processes (one delta, one cumulative), into a real sink; read back from its JSONL view."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from rankscope.report import perfetto
from rankscope.sink import BookConfig

from ..conftest import ROOT

WORKER = ROOT / "tests" / "workers" / "plain_otel.py"


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_plain_otel_sdk_program_lands_in_the_global_view(make_sink, tmp_path) -> None:
    view = tmp_path / "view.jsonl"
    sink = make_sink(
        backends={"jsonl": {"logging_mode": "global_reduce", "path": str(view)}},
        spans_dir=tmp_path / "spans",
        book=BookConfig(time_bucket=1.0, time_bucket_lag=1.0),
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "OTEL_"))}
    workers = [
        subprocess.Popen(
            [sys.executable, str(WORKER), sink.endpoint, "plain", name, temporality, gauge, updown, "3"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, temporality, gauge, updown in (("a", "delta", "10", "3"), ("b", "cumulative", "30", "9"))
    ]
    added = 0
    try:
        for worker in workers:
            out, err = worker.communicate(timeout=90)
            assert worker.returncode == 0, err[-3000:]
            added += int(out.split()[-1])
    finally:
        for worker in workers:
            worker.kill()
    sink.finalize("plain")
    assert sink.wait_written("plain", timeout=30)

    rows = _rows(view)
    steps: dict[int, dict[str, float]] = defaultdict(dict)
    for row in rows:
        if row["kind"] == "global_reduce":
            steps[row["step"]][row["key"]] = row["value"]
    assert len(steps) >= 3, "time buckets: several 1 s steps, not one step per request"
    assert all("rankscope/time" in values for values in steps.values())

    # Counter (delta from one process, cumulative turned into deltas from the other): exact total.
    assert sum(v.get("requests{route=/x}", 0.0) for v in steps.values()) == added
    # Histogram: 200 values in all; where a step holds a full set, the interpolated percentiles.
    assert sum(v.get("latency/count", 0.0) for v in steps.values()) == 200
    assert all(v["latency/count"] > 0 for v in steps.values() if "latency/count" in v)  # no empty increases
    full = [v for v in steps.values() if v.get("latency/count", 0) >= 100]
    assert full and all((v["latency/p50"], v["latency/p90"], v["latency/p99"]) == (50.0, 90.0, 99.0) for v in full)
    assert all(v["latency/mean"] == 50.0 for v in full)
    # UpDownCounter: LAST per process, SUM across (3 + 9), never more.
    depths = [v["queue_depth"] for v in steps.values() if "queue_depth" in v]
    assert depths.count(12.0) >= 2 and max(depths) == 12.0
    # Gauge: LAST per process, MEAN/MIN/MAX across (10 and 30).
    both = [v for v in steps.values() if v.get("temperature/min") == 10.0 and v.get("temperature/max") == 30.0]
    assert both and all(v["temperature"] == 20.0 for v in both)

    logs = [row for row in rows if row["kind"] == "log"]
    assert sorted(row["body"] for row in logs) == ["plain warning from a", "plain warning from b"]
    assert all(row["severity"] == "WARN" and row["step"] is not None for row in logs)

    status = sink.status("plain")
    assert status["refused_points"] == 0 and status["log_records"] == 2 and status["time_bucketed"]
    assert sink.overview()["refusals"] == {}
    spans = [json.loads(line) for line in sink.span_rows("plain") or ()]
    assert sorted(s["name"] for s in spans) == ["work-a", "work-b"] and all(s["step"] is not None for s in spans)
    out = tmp_path / "gantt.json"
    assert perfetto.write(spans, out).spans == 2  # spans without a step are drawn, in their time's step
    drawn = [e for e in json.loads(out.read_text())["traceEvents"] if e.get("ph") == "X"]
    assert sorted(e["name"] for e in drawn) == ["work-a", "work-b"] and all(
        e["args"]["step"] is not None for e in drawn
    )
