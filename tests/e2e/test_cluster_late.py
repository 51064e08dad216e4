"""Exact, however late (issue 50): a node's telemetry cut off far longer than 16 steps while the
job runs on, on the simulated cluster of ``test_cluster`` (three nodes of two ranks, an agent per
node, the gateway and a sink with its write-ahead log on the service host).

Only the path from node 2 to the service host is cut (a blackhole route): its ranks keep training
with the others (their all-reduce goes node to node), its agent keeps their data in its persistent
queue. The sink finalizes each step without the node's two ranks after its grace, then without
waiting; when the path is back the agent sends everything, and each late part merges into the
step's kept states (``sink.book.retained``). At the end every step-key of every view is the exact
total over the six ranks, as each view's documented convention says (docs/sink.md, "Late data"):
the JSONL view's last row of a step, the report's data, TensorBoard's last event of a step, W&B's
``late/`` keys beside the on-time ones; each corrected step has a ``corrected`` record, no step a
``partial`` one, and the last row of each step counts nobody missing.
"""

from __future__ import annotations

import signal
import struct
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ..cluster import SERVICE_IP
from ..wandb_file import by_step, history, run_files, run_id
from .test_cluster import NODES, PER_NODE, REFUSAL, Job, finish, job, rank_logs, run_ranks, view_rows, wait_for_step

pytestmark = pytest.mark.skipif(REFUSAL is not None, reason=f"the cluster tests build network namespaces: {REFUSAL}")
KEYS = ("v/sum", "v/mean", "v/max", "v/min", "samples")
STEPS_30S = 48
"""The 30 s cuts' job at 1 step/s: cut at step 10, back near step 40, a few steps on after it."""


def views(tmp: Path) -> dict[str, Any]:
    return {
        "report": {"backend": "report", "path": str(tmp / "report" / "report.html")},
        "tensorboard": {"backend": "tensorboard", "logging_mode": "global_reduce", "logdir": str(tmp / "tb")},
        "wandb": {
            "backend": "wandb",
            "logging_mode": "global_reduce",
            "mode": "offline",
            "dir": str(tmp / "wandb"),
            "project": "cluster",
        },
    }


def exact(tmp: Path) -> dict[int, dict[str, float]]:
    """Each step's exact global values from what every rank logged (each logged every step)."""
    by_step: dict[int, list[dict[str, float]]] = defaultdict(list)
    for row in rank_logs(tmp):
        by_step[row["step"]].append(row["values"])
    out = {}
    for step, rows in by_step.items():
        assert len(rows) == NODES * PER_NODE, (step, len(rows))
        values = [r["v/sum"] for r in rows]
        out[step] = {
            "v/sum": sum(values),
            "v/mean": sum(values) / len(values),
            "v/max": max(values),
            "v/min": min(values),
            "samples": float(len(rows)),
        }
    return out


def jsonl_last(tmp: Path) -> tuple[dict[int, dict[str, float]], list[dict[str, Any]]]:
    """The JSONL global view as its reader keeps it (a step's last row wins), and its records."""
    last: dict[int, dict[str, float]] = defaultdict(dict)
    records = []
    for row in view_rows(tmp, "global"):
        if row.get("kind") == "global_reduce":
            last[row["step"]][row["key"]] = row["value"]
        elif row.get("kind") == "anomaly":
            records.append(row)
    return last, records


def tensorboard_last(logdir: Path) -> dict[int, dict[str, float]]:
    """The global view's events as TensorBoard reads them, the last event of a step per tag."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (directory,) = [p for p in logdir.rglob("global") if p.is_dir()]
    events = EventAccumulator(str(directory), size_guidance={"scalars": 0})  # 0: keep every event
    events.Reload()
    last: dict[int, dict[str, float]] = defaultdict(dict)
    for tag in KEYS:
        for event in events.Scalars(tag):  # in the order written: a correction after its step's first
            last[event.step][tag] = event.value
    return last


def wandb_values(root: Path, sinks_killed: int) -> dict[int, dict[str, float]]:
    """W&B's history read back from the offline run: a step's ``late/`` values where a late update
    logged them, else its on-time values (docs/sink.md; ``by_step``)."""
    paths = run_files(root, timeout=60, killed=sinks_killed)  # a restarted sink resumes the run: a file of its own
    assert len(paths) == 1 + sinks_killed, paths
    assert len({run_id(p) for p in paths}) == 1, paths
    assert any("late/v/sum" in row for p in paths for row in history(p))  # corrections went beside the step
    return {step: {k: row[k] for k in KEYS} for step, row in by_step(paths).items()}


def report_points(tmp: Path) -> dict[int, dict[str, float]]:
    """The report's data: each global value its charts keep (``[step, global, ...]`` points)."""
    from rankscope.report.summary import read

    series = read(tmp / "report" / "report.jsonl").series
    points: dict[int, dict[str, float]] = defaultdict(dict)
    named = [(key, s) for (_, key), s in series.by_role.items()] + list(series.globals.items())
    for key, one in named:
        if key in KEYS:
            for point in one.points:
                points[int(point[0])][key] = point[1]
    return points


def partitioned(
    binaries: dict[str, str],
    tmp: Path,
    *,
    steps: int,
    pause: float,
    cut_at: int,
    cut_s: float,
    during: Callable[[Job], None] | None = None,
) -> None:
    """The job with node 2's telemetry cut for ``cut_s`` seconds from step ``cut_at`` (``during``
    done a third of the way in); the sink stopped at the end (its views finish: W&B's file, the
    report's page)."""
    with job(binaries, tmp, views=views(tmp)) as made:
        procs = run_ranks(made, steps, pause)
        wait_for_step(made, cut_at)
        node = made.net.nodes[2]
        made.net.blackhole(node, SERVICE_IP, on=True)
        cut_until = time.monotonic() + cut_s
        if during is not None:
            time.sleep(cut_s / 3)
            during(made)
        time.sleep(max(0.0, cut_until - time.monotonic()))
        made.net.blackhole(node, SERVICE_IP, on=False)
        finish(made, procs, steps - 1, timeout=cut_s + steps * pause + 240)
        caught_up(tmp, steps, timeout=120.0)
        sinks = [p for p in made.net.service.processes if "rankscope.cli" in map(str, p.proc.args)]
        sinks[-1].stop(signal.SIGTERM, timeout=60)  # the one running (a test may have restarted it)


def caught_up(tmp: Path, steps: int, timeout: float) -> None:
    """Wait until the JSONL view's last row of every step counts nobody missing: the cut node's
    agent delivered its queue. A quiet sink is not enough: after a long cut the agent's gRPC
    channel may still be backing off when the job's last step is written (one run under a loaded
    box stopped the sink a second before the queue came)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        last, _ = jsonl_last(tmp)
        if len(last) >= steps and all(last[s].get("rankscope/missing_processes") == 0 for s in range(steps)):
            return
        time.sleep(1.0)


def drained_in(tmp: Path) -> float:
    """Seconds from the first late update of the cut's steps to the last: the agent's backlog
    drained. Its queue joins what it holds into few requests (``sending_queue.batch`` in
    collector-config/agent.yaml); one merge window a request, each answered when the gateway
    forwarded its window, took ~65 s for the 120 s cut's backlog."""
    seen: dict[int, int] = defaultdict(int)
    late = []
    for row in view_rows(tmp, "global"):
        if row.get("kind") == "global_reduce" and row["key"] == "v/sum":
            seen[row["step"]] += 1
            if seen[row["step"]] > 1:
                late.append(row["time"])
    assert late, "no step was corrected"
    return max(late) - min(late)


def judge_views(tmp: Path, cut_steps: int, sinks_killed: int = 0) -> None:
    truth = exact(tmp)
    steps = sorted(truth)
    last, records = jsonl_last(tmp)
    assert {s: {k: last[s].get(k) for k in KEYS} for s in steps} == truth  # every step-key exact
    assert all(last[s]["rankscope/missing_processes"] == 0 for s in steps), "a step still counts a rank missing"
    corrected = sorted({r["step"] for r in records if r.get("type") == "corrected"})
    assert len(corrected) >= cut_steps, (len(corrected), cut_steps)  # far past the 16 steps kept live
    assert not [r for r in records if r.get("type") == "partial"]
    missing = [r for r in records if r.get("type") == "missing"]
    assert missing and missing[0]["step"] == corrected[0]  # named once, at the first step without them
    as_float32 = {
        s: {k: struct.unpack("f", struct.pack("f", v))[0] for k, v in row.items()} for s, row in truth.items()
    }
    assert {s: {k: v[k] for k in KEYS} for s, v in tensorboard_last(tmp / "tb").items()} == as_float32  # its scalars
    assert wandb_values(tmp / "wandb", sinks_killed) == truth
    points = report_points(tmp)
    assert points and all(points[s] == {k: truth[s][k] for k in points[s]} for s in points)


@pytest.mark.timeout(420)
def test_a_nodes_telemetry_cut_for_30_s_at_1_step_per_s_is_exact_in_every_view_at_the_end(binaries, tmp_path) -> None:
    partitioned(binaries, tmp_path, steps=STEPS_30S, pause=1.0, cut_at=10, cut_s=30.0)
    judge_views(tmp_path, cut_steps=20)


@pytest.mark.timeout(600)
def test_a_nodes_telemetry_cut_for_120_s_at_4_steps_per_s_is_exact_in_every_view_at_the_end(binaries, tmp_path) -> None:
    partitioned(binaries, tmp_path, steps=520, pause=0.25, cut_at=20, cut_s=120.0)  # the cut ends near step 500
    judge_views(tmp_path, cut_steps=400)
    assert drained_in(tmp_path) < 30.0  # a quarter of the cut (one merge window a request: ~65 s)


def agent_gateway_and_sink_killed(made: Job) -> None:
    """Node 2's agent SIGKILLed with its queue of the cut's steps, the gateway and the sink
    SIGKILLed: each restarted 2 s later on its own persistent queue (the sink: its state directory,
    where the steps it kept for late data are)."""
    made.net.nodes[2].processes[0].stop(signal.SIGKILL)  # the agent: the node's first process
    made.net.service.processes[1].stop(signal.SIGKILL)  # the sink is the first, the gateway the second
    made.net.service.processes[0].stop(signal.SIGKILL)
    time.sleep(2.0)
    made.sink()
    made.agent(2)
    made.gateway()


@pytest.mark.timeout(420)
def test_an_agent_the_gateway_and_the_sink_killed_during_a_30_s_cut_leave_every_view_exact(binaries, tmp_path) -> None:
    partitioned(
        binaries, tmp_path, steps=STEPS_30S, pause=1.0, cut_at=10, cut_s=30.0, during=agent_gateway_and_sink_killed
    )
    judge_views(tmp_path, cut_steps=20, sinks_killed=1)
