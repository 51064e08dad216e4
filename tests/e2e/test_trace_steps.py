"""One trace per step across torchrun ranks, straggler views, and the Perfetto file of the run.

Real processes end to end: 4 torchrun ranks (gloo world, no GPU) export OTLP spans to a real
sink on loopback; the test reads what the sink stored through its HTTP route, the straggler
view from the sink's JSONL backend, and the trace-event file that ``rankscope gantt`` writes.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

from rankscope.tracing.spans import step_ids

from ..conftest import ROOT


def torchrun(sink: Any, experiment: str, tmp_path: Path, attempt: int | None = None) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "OTEL_"))}
    env.update(RANKSCOPE_EXPERIMENT=experiment, RANKSCOPE_ENDPOINT=sink.endpoint)
    env["RANKSCOPE_RUN_ID"] = f"job-{experiment}"  # two torchruns here are one job's attempts: one run
    if attempt is not None:  # what a torchelastic restart reports, set directly
        env["OTEL_RESOURCE_ATTRIBUTES"] = f"rankscope.experiment.attempt={attempt}"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4"]
    command.append(str(ROOT / "tests" / "workers" / "trace_worker.py"))
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240, check=False, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]


def stored_spans(sink: Any, experiment: str, query: str = "") -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{sink.http_port}/rankscope/v1/spans?experiment={experiment}{query}"
    with urllib.request.urlopen(url, timeout=10) as response:
        return [json.loads(line) for line in response.read().decode().splitlines()]


def test_every_rank_of_a_step_shares_one_trace_under_one_root(make_sink, tmp_path: Path) -> None:
    out = tmp_path / "views.jsonl"
    sink = make_sink(backends={"jsonl": {"logging_mode": "global_reduce", "path": str(out)}})
    torchrun(sink, "traced", tmp_path)
    sink.finalize("traced")
    assert sink.wait_written("traced")
    spans = stored_spans(sink, "traced")

    by_step: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for span in spans:
        by_step[span["step"]].append(span)
    assert sorted(by_step) == [0, 1, 2]
    trace_ids = set()
    for step, found in by_step.items():
        assert len({s["trace_id"] for s in found}) == 1, f"step {step} spans more than one trace"
        trace_id, root_id = step_ids("traced", 0, step)
        assert found[0]["trace_id"] == f"{trace_id:032x}"
        trace_ids.add(found[0]["trace_id"])
        roots = [s for s in found if not s["parent_span_id"]]
        assert len(roots) == 1 and roots[0]["span_id"] == f"{root_id:016x}", roots
        assert roots[0]["rank"] == 0 and roots[0]["name"] == "step"
        blocks = {s["rank"]: s for s in found if s["name"] == "train"}
        assert sorted(blocks) == [0, 1, 2, 3]
        assert all(b["parent_span_id"] == roots[0]["span_id"] for b in blocks.values())
        for phase in ("train/fwd", "train/bwd"):
            phases = [s for s in found if s["name"] == phase]
            assert sorted(s["rank"] for s in phases) == [0, 1, 2, 3]
            for s in phases:  # under its own rank's block, inside it in time
                block = blocks[s["rank"]]
                assert s["parent_span_id"] == block["span_id"]
                assert block["start_ns"] <= s["start_ns"] <= s["end_ns"] <= block["end_ns"]
    assert len(trace_ids) == 3

    # Straggler view: rank 3 sleeps 30x longer in fwd in every step.
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    view = {(r["step"], r["key"]): r["value"] for r in rows if r["kind"] == "global_reduce"}
    for step in range(3):
        assert view[(step, "straggler/train/fwd/late_rank")] == 3.0
        assert view[(step, "straggler/train/fwd/over_others")] > 3
        assert view[(step, "straggler/train/fwd/late_s")] > 0.02
        assert view[(step, "train/fwd/duration_max_s")] >= 0.03

    # A restarted attempt replays the steps in new traces.
    torchrun(sink, "traced", tmp_path, attempt=1)
    again = [s for s in stored_spans(sink, "traced", "&first=0&last=0") if s["attempt"] == 1]
    assert len(again) == 4 * 3 + 1
    assert {s["trace_id"] for s in again} == {f"{step_ids('traced', 1, 0)[0]:032x}"}
    assert f"{step_ids('traced', 1, 0)[0]:032x}" not in trace_ids

    # The Perfetto file of the run: one named process per rank, sorted by rank, nested slices.
    from rankscope.cli import main

    perfetto = tmp_path / "run.json.gz"
    url = f"http://127.0.0.1:{sink.http_port}"
    assert main(["gantt", "--sink", url, "--experiment", "traced", "--steps", "0:2", "-o", str(perfetto)]) == 0
    with gzip.open(perfetto, "rt") as document:
        events = json.load(document)["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    order = {e["pid"]: e["args"]["sort_index"] for e in events if e["name"] == "process_sort_index"}
    assert sorted(names.values()) == ["trainer_r0", "trainer_r1", "trainer_r2", "trainer_r3"]
    assert all(isinstance(pid, int) for pid in names)
    assert sorted(names, key=order.__getitem__) == sorted(names, key=lambda pid: names[pid])
    slices = [e for e in events if e["ph"] == "X"]
    assert len(slices) == 6 * (4 * 3 + 1)  # 2 attempts x 3 steps x (4 ranks x 3 spans + the root)
    assert_properly_nested(slices)


def assert_properly_nested(slices: list[dict[str, Any]]) -> None:
    """On every (pid, tid) track, two slices are either disjoint or one contains the other."""
    tracks: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for e in slices:
        assert e["dur"] >= 0 and isinstance(e["ts"], float | int)
        tracks[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for track, spans in tracks.items():
        stack: list[float] = []
        for start, end in sorted(spans, key=lambda se: (se[0], -se[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-3, f"slice [{start}, {end}] crosses its parent on {track}"
            stack.append(end)


def test_gantt_filters_and_jsonl_files(make_sink, tmp_path: Path) -> None:
    sink = make_sink()
    torchrun(sink, "filtered", tmp_path)
    spans = stored_spans(sink, "filtered")
    source = tmp_path / "spans.jsonl"
    source.write_text("".join(json.dumps(s) + "\n" for s in spans))
    from rankscope.cli import main

    out = tmp_path / "rank13.json"
    assert main(["gantt", str(source), "--steps", "1", "--ranks", "1,3", "-o", str(out)]) == 0
    events = json.loads(out.read_text())["traceEvents"]
    names = sorted(e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name")
    assert names == ["trainer_r1", "trainer_r3"]
    assert {e["args"]["step"] for e in events if e["ph"] == "X"} == {1}

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"name": "x"}\n')
    assert main(["gantt", str(bad), "-o", str(tmp_path / "bad.json")]) == 1
