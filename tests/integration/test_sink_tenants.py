"""Tenants that cannot hurt each other: many experiments, a huge one, idle sockets, a broken view.

Real sinks on loopback; clients speak real OTLP/HTTP."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb

from rankscope.backends.base import LoggerBackend, register_backend
from rankscope.core import names as attr
from rankscope.otlp.common import key_value
from rankscope.sink import KEPT_BACKENDS, BookConfig
from rankscope.sink.testing import RunLimits

from .test_sink_hostile import Http, close_connections, gauge, request  # noqa: F401 (a fixture)


def _stepped(experiment: str, pid: str, step: int, rank: int = 0, world: int = 1, keys: int = 1) -> Any:
    r = request(
        [gauge(f"k{i}", float(rank), "max", step) for i in range(keys)],
        experiment,
        **{attr.SERVICE_INSTANCE_ID: pid, attr.RANK: str(rank), attr.WORLD_SIZE: str(world)},
    )
    marker = pb.Metric(name=attr.FLUSH_MARKER)
    marker.sum.data_points.add(as_int=keys, attributes=[key_value(attr.STEP, step)])
    r.resource_metrics[0].scope_metrics[0].metrics.append(marker)
    return r


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_thousand_experiments_then_idle_release_threads_and_files(make_sink, tmp_path: Path) -> None:
    sink = make_sink(
        runs=RunLimits(idle_timeout=1.0),
        state_dir=tmp_path / "state",
        backends={"jsonl": {"logging_mode": "global_reduce", "path": str(tmp_path / "v" / "{experiment}.jsonl")}},
        book=BookConfig(grace=0.5),
    )
    conn = Http(sink.http_port)
    conn.export(_stepped("warmup", "w", 0))
    time.sleep(2.5)  # the warm-up experiment is evicted too: the baseline holds only the sink's own threads
    threads, fds = threading.active_count(), _fds()
    for i in range(1000):
        assert conn.export(_stepped(f"exp-{i}", "p", 0))[:2] == (200, 0)
    assert sink.overview()["experiments"] + sink.closed.evicted >= 1001
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (sink.overview()["experiments"] or threading.active_count() > threads + 10):
        time.sleep(0.2)
    conn.close()
    assert sink.overview()["experiments"] == 0 and sink.closed.evicted >= 1000
    assert threading.active_count() <= threads + 10
    assert _fds() <= fds + 10
    assert len(list((tmp_path / "v").iterdir())) == 1001  # every experiment's view was written before eviction
    assert conn.export(_stepped("exp-7", "p", 1))[:2] == (200, 0)  # reopened on new data, steps go on
    assert sink.wait_written("exp-7") and sink.status("exp-7")["last_finalized_step"] == 1
    conn.close()


def test_two_thousand_processes_in_one_experiment_and_a_neighbour_keeps_its_pace(make_sink, tmp_path: Path) -> None:
    """While 2,000 processes of one experiment report (and 2,000 late ones after them), a
    neighbour's steps keep finalizing: it is never left waiting until the flood is over."""
    views = tmp_path / "{experiment}.jsonl"
    sink = make_sink(
        backends={"jsonl": {"logging_mode": "global_reduce", "path": str(views)}}, book=BookConfig(grace=30.0)
    )
    flooding, stop = threading.Event(), threading.Event()
    finalized_during_flood: list[int] = []
    gave_up: list[int] = []

    def neighbour() -> None:
        conn = Http(sink.http_port)
        step = 0
        while not stop.is_set():
            conn.export(_stepped("neighbour", "n", step))
            deadline = time.monotonic() + 10  # a wait limit, not a latency figure (those are in benchmarks/)
            while sink.status("neighbour")["last_finalized_step"] < step and time.monotonic() < deadline:
                time.sleep(0.01)
            if sink.status("neighbour")["last_finalized_step"] < step:
                gave_up.append(step)
            elif flooding.is_set():
                finalized_during_flood.append(step)
            step += 1
            time.sleep(0.1)
        conn.close()

    thread = threading.Thread(target=neighbour)
    thread.start()
    try:
        conn = Http(sink.http_port)
        flooding.set()
        for step in range(2):
            for rank in range(2000):  # 2,000 processes, 10 keys each, half of them late for step 0
                r = _stepped("huge", f"p{rank}", step, rank, 2000, keys=10)
                assert conn.export(r)[:2] == (200, 0)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and sink.status("huge")["last_finalized_step"] < 1:
            time.sleep(0.05)
        for rank in range(2000):  # then 2,000 late reports for step 0: merged, and rewritten once per second
            r = request([gauge("k0", 5000.0, "max", 0)], "huge", **{attr.SERVICE_INSTANCE_ID: f"late{rank}"})
            assert conn.export(r)[:2] == (200, 0)
        flooding.clear()
        conn.close()
    finally:
        stop.set()
        thread.join(30)
    assert sink.wait_written("huge")
    status = sink.status("huge")
    assert status["last_finalized_step"] == 1 and status["processes"] == 4000 and status["late_points"] == 2000
    assert gave_up == [], gave_up  # every neighbour step finalized
    assert len(finalized_during_flood) >= 3, finalized_during_flood  # and they did so while the flood went on
    rows = [json.loads(line) for line in (tmp_path / "huge.jsonl").read_text().splitlines()]
    late = [r for r in rows if r.get("late") and r["key"] == "k0"]
    assert 1 <= len(late) <= 30 and late[-1]["value"] == 5000.0  # not one rewrite per late request


def test_idle_half_open_connections_do_not_stop_a_client(make_sink) -> None:
    sink = make_sink()
    idle = []
    for _ in range(500):
        s = socket.create_connection(("127.0.0.1", sink.http_port))
        s.sendall(b"POST /v1/metrics HTTP/1.1\r\nHost: x\r\n")  # headers never finish
        idle.append(s)
    try:
        conn = Http(sink.http_port)  # its 10 s socket timeout would fail the export if the sink were stuck
        assert conn.export(_stepped("normal", "p", 0))[:2] == (200, 0)
        assert sink.wait_written("normal")
        conn.close()
    finally:
        for s in idle:
            s.close()


class _Broken(LoggerBackend):
    def log_batch(self, metrics: Any, global_step: Any, *args: Any, **kwargs: Any) -> None:
        raise OSError("disk on fire")


def test_a_failing_view_shows_as_failing(make_sink, tmp_path: Path) -> None:
    register_backend("broken", _Broken)
    sink = make_sink(
        backends={
            "broken": {"logging_mode": "global_reduce"},
            "jsonl": {"logging_mode": "global_reduce", "path": str(tmp_path / "v.jsonl")},
        }
    )
    conn = Http(sink.http_port)
    for step in range(3):
        conn.export(_stepped("e", "p", step))
    conn.close()
    assert sink.wait_written("e")
    status = sink.status("e")
    assert status["views"]["jsonl"]["last_written_step"] == 2
    assert status["views"]["broken"]["last_written_step"] == -1
    assert status["views"]["broken"]["failures"] == 3 and "disk on fire" in status["views"]["broken"]["last_error"]
    assert status["last_written_step"] == -1  # not every view has it
    assert len(sink.internal_errors) == 1  # logged once, counted three times
    sink.internal_errors.clear()


def test_a_jobs_sink_keeps_the_run_beside_a_jsonl_view_of_the_users_own(
    make_sink, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``KEPT_BACKENDS`` (a job's own sink) adds the run's report page and ``metrics.jsonl`` beside
    whatever views the run has: a ``jsonl`` view of the user's writes where it says, and the kept
    one still writes the run's directory; a view of the same backend and path is not doubled."""
    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "mine.jsonl"
    sink = make_sink(
        added_views=KEPT_BACKENDS,
        backends={
            "jsonl": {"logging_mode": "global_reduce", "path": str(mine)},
            "report": {},
            "metrics": {"backend": "console", "format": "off"},  # named as the kept view: both kept
        },
    )
    conn = Http(sink.http_port)
    for step in range(2):
        conn.export(_stepped("kept", "p", step))
    conn.close()
    assert sink.wait_written("kept")
    views = sink.status("kept")["views"]
    # The user's report view is the kept one (the same backend and path: not doubled).
    assert sorted(views) == ["jsonl", "kept_metrics", "metrics", "report"], views
    kept = Path(views["kept_metrics"]["location"])
    assert kept.name == "metrics.jsonl" and kept.parent.parent == tmp_path / "rankscope_logs" / "kept"
    for path in (mine, kept):
        assert {json.loads(line)["step"] for line in path.read_text().splitlines()} == {0, 1}, path


def test_a_posted_view_with_a_path_of_any_json_leaves_the_kept_views_and_the_sink_alone(
    make_sink, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job's sink uses its own job's posted paths as given (``trust_posted_paths``): a path that
    is a list is that view's trouble (off, said), never the run's; the kept views write."""
    from rankscope.export.senders import post_config

    monkeypatch.chdir(tmp_path)
    sink = make_sink(added_views=KEPT_BACKENDS, trust_posted_paths=True)
    post_config(f"http://127.0.0.1:{sink.http_port}", "odd", {"jsonl": {"path": ["x", {"y": 1}]}})
    conn = Http(sink.http_port)
    conn.export(_stepped("odd", "p", 0))
    conn.close()

    def written() -> int:
        view = ((sink.status("odd") or {}).get("views") or {}).get("metrics") or {}
        return int(view.get("last_written_step", -1))

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and written() < 0:  # the step's grace: its one process said nothing more
        time.sleep(0.05)
    views = sink.status("odd")["views"]
    assert views["metrics"]["last_written_step"] == 0 and views["jsonl"]["disabled"], views
    assert [e for e in sink.internal_errors if "view 'jsonl' of 'odd' (init)" not in e] == []  # said once, that view's
    sink.internal_errors.clear()
