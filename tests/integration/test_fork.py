"""Processes made by fork: torch DataLoader workers and multiprocessing children.

Their values reach the parent's experiment (the child re-arms rankscope after fork: a new export
thread, a new identity, the same experiment), or, when the parent keeps its views to itself, they
are refused with one warning. Never a hang, never a silent loss. Each job runs as its own process
against a real sink, bounded in time.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rankscope.export.senders import _HEADER as RECORD
from rankscope.export.senders import METRICS, ForkRelay, fork_pair
from rankscope.sink import BookConfig, Sink

from ..conftest import run_python

DATALOADER_JOB = """
import os, sys, torch, rankscope as rs

class Items(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):  # runs in a DataLoader worker
        rs.record_metric("data/item", float(i), rs.Reduce.SUM)
        rs.record_metric("data/items", 1, rs.Reduce.SUM)
        rs.record_sample("items", {"i": i}, rank_by="i", k=2)  # relayed through the parent as log records
        return torch.tensor([float(i)])

rs.init(experiment=sys.argv[1], role="trainer")  # endpoint: RANKSCOPE_ENDPOINT
PERSISTENT = False
loader = torch.utils.data.DataLoader(Items(), batch_size=4, num_workers=2, persistent_workers=PERSISTENT)
step = 0
for epoch in range(2):  # each epoch forks two new workers, unless they persist
    for batch in loader:
        rs.record_metric("loss", float(batch.sum()))
        rs.flush(step)
        step += 1
rs.record_metric("loss", 0.0)
rs.flush(step)  # the workers' last values (sent as they exit, or when asked at shutdown) land in an open step
print(f"pid={os.getpid()} last_step={step} dropped={rs.dropped_points()}")
# No rs.shutdown(): it runs at exit, while persistent workers are still alive.
"""


def _views(directory: Path) -> dict[str, Any]:
    return {
        "global": {"backend": "jsonl", "logging_mode": "global_reduce", "path": str(directory / "global.jsonl")},
        "per_rank": {"backend": "jsonl", "logging_mode": "per_rank_reduce", "path": str(directory / "per_rank.jsonl")},
    }


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _fields(stdout: str) -> dict[str, int]:
    line = [x for x in stdout.splitlines() if x.startswith("pid=")][-1]
    return {k: int(v) for k, v in (part.split("=") for part in line.split())}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("persistent", [False, True])
def test_dataloader_workers_values_reach_the_experiment_view(
    persistent: bool, make_sink: Callable[..., Sink], tmp_path: Path
) -> None:
    """num_workers=2: new workers each epoch (they export as they exit), or persistent workers
    still alive when the program ends (the parent's shutdown asks them for their values)."""
    sink = make_sink(backends=_views(tmp_path), book=BookConfig(grace=30))
    job = DATALOADER_JOB.replace("sys.argv[1]", "'loader'").replace("PERSISTENT = False", f"PERSISTENT = {persistent}")
    result = run_python(job, {"RANKSCOPE_ENDPOINT": sink.endpoint})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "rankscope" not in result.stderr, result.stderr[-3000:]
    fields = _fields(result.stdout)
    assert fields["dropped"] == 0
    sink.stop()  # finalizes and writes every open step

    rows = [r for r in _read(tmp_path / "global.jsonl") if not r.get("late") and r["kind"] == "global_reduce"]
    steps = {r["step"] for r in rows}
    assert steps == set(range(fields["last_step"] + 1))
    total = {key: sum(r["value"] for r in rows if r["key"] == key) for key in ("data/item", "data/items")}
    assert total == {"data/item": 2.0 * sum(range(64)), "data/items": 128.0}  # two epochs, nothing lost
    assert all(r["value"] == 0.0 for r in rows if r["key"] == "rankscope/missing_processes")  # no one waited for

    # Two workers per epoch (or two for both), each a process of its own under the parent's role and rank.
    per_rank = _read(tmp_path / "per_rank.jsonl")
    workers = {r["process"] for r in per_rank if r["key"] == "data/item"}
    assert len(workers) == (2 if persistent else 4), workers
    assert all(w.startswith("trainer_r0_") for w in workers), workers
    assert {r["process"] for r in per_rank if r["key"] == "loss"} == {"trainer_r0"}
    assert sum(r["value"] for r in per_rank if r["key"] == "data/items") == 128.0
    samples = [r for r in _read(tmp_path / "global.jsonl") if r["kind"] == "sample" and r["table"] == "items"]
    assert {0, 63} <= {r["row"]["i"] for r in samples}  # the workers' rows reached the experiment's table
    assert all(r["process"].startswith("trainer_r0_") for r in samples), samples


FORK_STRESS_JOB = """
import multiprocessing, os, sys, threading, time, rankscope as rs

rs.init(experiment="stress", role="generator")
stop = threading.Event()

def busy_parent():  # records and flushes all the time: locks are held at any moment a fork happens
    step = 0
    while not stop.is_set():
        for k in range(50):
            rs.record_metric(f"parent/k{k}", 1.0)
        rs.flush(step)
        step += 1
        time.sleep(0.002)
    rs.flush(step)

def child(index):
    for _ in range(100):
        rs.record_metric("child/values", 1, rs.Reduce.SUM)
    rs.record_metric("child/index_sum", float(index), rs.Reduce.SUM)
    # returns: multiprocessing ends the child with os._exit (no atexit)

thread = threading.Thread(target=busy_parent)
thread.start()
fork = multiprocessing.get_context("fork")
for round in range(4):
    procs = [fork.Process(target=child, args=(round * 4 + i,)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0, (p.exitcode, "a forked child hung or failed")
stop.set()
thread.join()
rs.shutdown()
print(f"pid={os.getpid()} dropped={rs.dropped_points()}")
"""


@pytest.mark.timeout(180)
def test_forked_children_never_hang_and_export_what_they_record(make_sink: Callable[..., Sink], tmp_path: Path) -> None:
    """16 multiprocessing children forked while the parent records, flushes and exports on two
    threads: each re-arms, exports at its exit and ends in time."""
    sink = make_sink(backends=_views(tmp_path), book=BookConfig(grace=30))
    result = run_python(FORK_STRESS_JOB, {"RANKSCOPE_ENDPOINT": sink.endpoint}, timeout=150)
    assert result.returncode == 0, result.stderr[-3000:]
    assert _fields(result.stdout)["dropped"] == 0
    sink.stop()
    rows = [r for r in _read(tmp_path / "global.jsonl") if not r.get("late")]
    total = {key: sum(r["value"] for r in rows if r["key"] == key) for key in ("child/values", "child/index_sum")}
    assert total == {"child/values": 1600.0, "child/index_sum": float(sum(range(16)))}
    children = {r["process"] for r in _read(tmp_path / "per_rank.jsonl") if r["key"] == "child/values"}
    assert len(children) == 16 and all(c.startswith("generator_r0_") for c in children)


@pytest.mark.timeout(120)
def test_a_parent_without_sink_or_endpoint_refuses_forked_values_with_one_warning(tmp_path: Path) -> None:
    job = DATALOADER_JOB.replace(
        'rs.init(experiment=sys.argv[1], role="trainer")',
        "rs.init(experiment='alone', role='trainer', "
        f"backends={{'jsonl': {{'logging_mode': 'per_rank_reduce', 'path': {str(tmp_path / 'alone.jsonl')!r}}}}})",
    )
    result = run_python(job, {"RANKSCOPE_SINK": "off"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("are not recorded") == 1, result.stderr[-3000:]  # four workers, one warning
    assert "RANKSCOPE_SINK=embedded" in result.stderr
    rows = _read(tmp_path / "alone.jsonl")
    assert {r["key"] for r in rows} == {"loss"}  # the parent's own view is whole
    assert _fields(result.stdout)["dropped"] == 0


def test_the_parents_shutdown_reads_what_an_exited_child_left_in_its_socket() -> None:
    """A multiprocessing child exports at its exit and is joined; its request may still be in
    the socket when the parent shuts down, the relay thread busy with another child's. The
    shutdown's ``flush_children`` asked only live children and returned at once: the request was
    read after it and lost ("a forked child exported values after this process shut rankscope
    down", 1 run in 18 of the fork stress test under load). It now reads every socket first."""
    delivered: list[bytes] = []
    busy = threading.Event()

    def deliver(kind: bytes, payload: bytes) -> None:
        if payload == b"first":
            busy.set()
            time.sleep(0.5)  # the relay thread is busy with this child's request meanwhile
        delivered.append(payload)

    relay = ForkRelay(deliver)
    pairs = [fork_pair(), fork_pair()]
    for parent_end, _ in pairs:
        relay.adopt(parent_end)
    time.sleep(0.1)  # both adopted
    pairs[0][1].send(RECORD.pack(1, 1, 0, 1, METRICS) + b"first")
    assert busy.wait(5)
    pairs[1][1].send(RECORD.pack(2, 1, 0, 1, METRICS) + b"second")
    pairs[1][1].close()  # that child exited
    assert relay.flush_children(5.0) == 0
    assert delivered == [b"first", b"second"], delivered
    pairs[0][1].close()
