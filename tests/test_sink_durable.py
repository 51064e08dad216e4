"""Nothing acknowledged is lost: SIGKILL the sink at a random moment, restart it on the same ports.

Four client processes' worth of OTLP clients (each its own ``service.instance.id``, each
retrying until answered, as OTLP exporters do) send 30 steps to a ``rankscope sink`` process
with a state directory. The sink is killed with SIGKILL at a seeded random moment and
restarted; every step of every process must be in the final view exactly once."""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from pathlib import Path

import pytest

from rankscope._internal import attributes as attr
from rankscope._internal.wire import key_value

from .conftest import free_port
from .pipeline import start_sink
from .test_sink_hostile import Http
from .test_sink_tenants import _stepped

STEPS = 30
RANKS = 4


def _client(port: int, rank: int, done: list[int]) -> None:
    for step in range(STEPS):
        r = _stepped("durable", f"proc{rank}", step, rank, RANKS)
        ones = r.resource_metrics[0].scope_metrics[0].metrics[0]
        ones.Clear()
        ones.name = "ones"  # SUM of 1 per process: a step merged twice would show 8, a lost one 3
        ones.sum.data_points.add(as_double=1.0, attributes=[key_value(attr.REDUCE, "sum"), key_value(attr.STEP, step)])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                conn = Http(port)
                status = conn.export(r)[0]
                conn.close()
                if status == 200:
                    break
            except OSError:  # the sink is down: retry, as an OTLP exporter does
                pass
            time.sleep(0.05)
        else:
            raise AssertionError(f"rank {rank} step {step} never acknowledged")
        time.sleep(0.03)
    done.append(rank)


@pytest.mark.parametrize("seed", [1, 2])
def test_sigkill_at_a_random_moment_loses_and_duplicates_nothing(tmp_path: Path, seed: int) -> None:
    grpc, http = free_port(), free_port()
    out = tmp_path / "views.jsonl"
    backends = {"jsonl": {"logging_mode": "global_reduce", "path": str(out)}}
    sink = start_sink(tmp_path, "sink", backends, grpc, http, grace=30.0)
    done: list[int] = []
    clients = [threading.Thread(target=_client, args=(http, rank, done)) for rank in range(RANKS)]
    try:
        for c in clients:
            c.start()
        time.sleep(random.Random(seed).uniform(0.2, 1.5))
        sink.stop(signal.SIGKILL)
        sink = start_sink(tmp_path, "sink", backends, grpc, http, grace=30.0)
        for c in clients:
            c.join(120)
        assert sorted(done) == list(range(RANKS))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
            if {r["step"] for r in rows if r["key"] == "ones"} >= set(range(STEPS)):
                break
            time.sleep(0.1)
    finally:
        sink.stop()
    last: dict[int, float] = {}
    for row in rows:  # a view may write a step twice if the kill fell between its write and the checkpoint
        if row["key"] == "ones":
            last[row["step"]] = row["value"]
    assert last == dict.fromkeys(range(STEPS), float(RANKS))
    missing = {r["step"]: r["value"] for r in rows if r["key"] == "rankscope/missing_processes"}
    assert all(v == 0.0 for v in missing.values()), missing
    assert not any(r.get("late") for r in rows), [r for r in rows if r.get("late")][:5]
