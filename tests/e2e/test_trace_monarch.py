"""Trace context across real Monarch actor calls: controller span → actor spans, same step trace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from rankscope.tracing.spans import step_ids

from ..conftest import ROOT
from .test_trace_steps import assert_properly_nested


def test_controller_to_actor_call_is_a_parent_child_pair_across_processes(make_sink, tmp_path: Path) -> None:
    sink = make_sink()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "OTEL_"))}
    worker = ROOT / "tests" / "workers" / "monarch_trace.py"
    result = subprocess.run(
        [sys.executable, str(worker), sink.endpoint], env=env, capture_output=True, text=True, timeout=180, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-4000:]
    sink.finalize("monarch-trace")
    url = f"http://127.0.0.1:{sink.http_port}/rankscope/v1/spans?experiment=monarch-trace"
    with urllib.request.urlopen(url, timeout=10) as response:
        spans = [json.loads(line) for line in response.read().decode().splitlines()]

    for step in range(2):
        mine = [s for s in spans if s["step"] == step]
        trace_id, root_id = step_ids("monarch-trace", 0, step)
        assert {s["trace_id"] for s in mine} == {f"{trace_id:032x}"}
        (root,) = [s for s in mine if not s["parent_span_id"]]
        assert root["span_id"] == f"{root_id:016x}" and root["role"] == "controller"
        (rollout,) = [s for s in mine if s["name"] == "rollout"]
        assert rollout["parent_span_id"] == root["span_id"]
        generates = [s for s in mine if s["name"] == "generate"]
        assert len(generates) == 2 and len({s["pid"] for s in generates}) == 2
        for span in generates:  # the callee's span is a child of the caller's, in another process
            assert span["parent_span_id"] == rollout["span_id"]
            assert span["pid"] != rollout["pid"] and span["role"] == "Generator"
            assert span["attributes"]["rankscope.caller"] == rollout["process"]
        (ping,) = [s for s in mine if s["name"] == "pinged"]
        assert ping["parent_span_id"] == rollout["span_id"]

    from rankscope.cli import main

    out = tmp_path / "monarch.json"
    assert (
        main(["gantt", "--sink", f"http://127.0.0.1:{sink.http_port}", "--experiment", "monarch-trace", "-o", str(out)])
        == 0
    )
    events = json.loads(out.read_text())["traceEvents"]
    starts = [e for e in events if e["ph"] == "s"]
    finishes = [e for e in events if e["ph"] == "f"]
    assert len(starts) == len(finishes) == 4  # one arrow per generate call (2 steps x 2 actors)
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert {names[e["pid"]] for e in starts} == {"controller_r0"}
    assert_properly_nested([e for e in events if e["ph"] == "X"])
