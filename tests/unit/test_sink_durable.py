"""Nothing acknowledged is lost across an upgrade: a state directory from a sink before running
merges (record version 1, one state dict per point) still replays, in process.

The SIGKILL test of a sink process is ``tests/integration/test_sink_durable.py``."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest


def test_records_written_before_rows_still_replay(tmp_path: Path) -> None:
    """A state directory from a sink before running merges (one state dict per point, record
    version 1) is replayed by this one: an upgrade loses nothing acknowledged."""
    import marshal

    from rankscope.core import names as attr
    from rankscope.sink import Sink, SinkConfig
    from rankscope.sink.testing import WriteAheadLog

    wal = WriteAheadLog(tmp_path)
    log = wal.open("old")
    for rank in range(2):
        resource = {attr.EXPERIMENT_ID: "old", attr.SERVICE_INSTANCE_ID: f"p{rank}", attr.RANK: str(rank)}
        points = [
            ("loss", "mean", 0, {"reduction_type": "mean", "sum": 3.0 + rank, "count": 2}),
            ("peak", "max", 0, {"reduction_type": "max", "max": 10.0 * rank}),
        ]
        log.append(0, marshal.dumps((bytes([rank]) * 16, resource, points, [(0, 0, False)])))
    log.sync()
    wal.close()
    path = tmp_path / "views.jsonl"
    sink = Sink(
        SinkConfig(
            grpc_port=None,
            http_port=None,
            state_dir=tmp_path,
            backends={"jsonl": {"logging_mode": "global_reduce", "path": str(path)}},
        )
    ).start()
    try:
        sink.finalize("old")
        assert sink.wait_written("old")
    finally:
        sink.stop()
    rows = {r["key"]: r["value"] for r in map(json.loads, path.read_text().splitlines())}
    assert rows["loss"] == (3.0 + 4.0) / 4 and rows["peak"] == 10.0 and rows["peak/argmax_rank"] == 1.0
    assert sink.internal_errors == []


def test_every_written_step_is_journaled_as_it_is_written_so_a_crash_replays_none_of_them(tmp_path: Path) -> None:
    """Between two checkpoints (0.1 s apart) the views' steps are in ``written.log``: a log reopened
    after a crash (no close, no checkpoint) replays no record of a written step, and a torn last
    line (the crash cut it) is skipped."""
    from rankscope.sink.testing import JOURNAL, ExperimentLog

    log = ExperimentLog(tmp_path / "run", "x", 1 << 20)
    seqs = [log.append(step, b"record %d" % step) for step in range(10)]
    log.sync()
    for step, seq in enumerate(seqs[:8]):
        log.written_view(step, seq, step, 0)  # the first checkpoints, the next 7 only journal (within 0.1 s)
    with open(tmp_path / "run" / JOURNAL, "ab") as journal:
        journal.write(b"9 10 9")  # a torn line: never counted
    # SIGKILL here: no close, no checkpoint. The next sink opens the same directory.
    again = ExperimentLog(tmp_path / "run", "x", 1 << 20)
    assert [step for _, step, _ in again.replay()] == [8, 9]
    assert again.last_finalized == 7


def test_a_record_of_flush_markers_alone_is_covered_by_its_steps_view_and_its_segment_goes(tmp_path: Path) -> None:
    """A rank that exports its marker apart from its values (a Monarch controller's flush(N), a
    straggler's marker after the grace period): the marker's record is covered by the step's view,
    and a marker of a finalized step is not logged at all, so every segment is deleted."""
    from rankscope.core import names as attr
    from rankscope.otlp.markers import Marker
    from rankscope.sink import BookConfig
    from rankscope.sink.testing import ExperimentLog, Refusals, ResourceBatch, StateRows, StepBook, encode_record

    experiment = StepBook("x", BookConfig(grace=5.0), clock=lambda: 0.0)
    log = ExperimentLog(tmp_path, "x", 200)  # a segment per record or two
    resource = {attr.SERVICE_INSTANCE_ID: "a", attr.ROLE: "trainer", attr.RANK: "0", attr.WORLD_SIZE: "1"}

    def send(states: list[StateRows], markers: list[Marker]) -> None:
        batch = ResourceBatch("x", dict(resource), states=states, markers=markers)
        refused = Refusals()
        taken = experiment.take(batch, refused)
        assert taken is not None
        seqs = {
            s: log.append(s, encode_record(b"", p.resource, p.states, p.markers, p.samples))
            for s, p in taken.parts.items()
        }
        experiment.merge(taken, refused, seqs)

    for step in range(6):
        send([StateRows("sum", step, ["loss"], [(1.0,)])], [])
        send([], [Marker(step, 0, False)])
        for view in experiment.ready():
            log.written_view(view.step, view.seq, view.step, view.attempt, force=True)
    send([], [Marker(2, 0, False)])  # a finalized step's marker: the process is live, nothing to log
    log.close()
    assert [seg.name for seg in tmp_path.glob("seg-*.log")] == []
    assert list(ExperimentLog(tmp_path, "x", 200).replay()) == []


@pytest.mark.parametrize("first", [0, 1])
def test_the_time_buckets_a_first_step_took_over_are_covered_by_its_view(tmp_path: Path, first: int) -> None:
    """A rank exports step-less values for 4 s before its first flush (time buckets 0-3, bucket 0
    viewed, then late data for it), then runs 2 steps from ``first``: the step takes over the
    buckets from its number on, drops bucket 0's pending late data below it, and its view covers
    the records of both, so a restarted sink replays none of them as steps of their own."""
    from rankscope.core import names as attr
    from rankscope.otlp.markers import Marker
    from rankscope.sink import BookConfig
    from rankscope.sink.testing import ExperimentLog, Refusals, ResourceBatch, StateRows, StepBook, encode_record

    class Clock:
        now = 1000.0

        def __call__(self) -> float:
            return self.now

    clock = Clock()
    experiment = StepBook("x", BookConfig(grace=5.0, time_bucket=1.0, time_bucket_lag=2.0), clock=clock, wall=clock)
    log = ExperimentLog(tmp_path, "x", 1 << 20)
    resource = {attr.SERVICE_INSTANCE_ID: "a", attr.ROLE: "trainer", attr.RANK: "0", attr.WORLD_SIZE: "1"}
    views = []

    def send(states: list[StateRows], markers: list[Marker]) -> None:
        batch = ResourceBatch("x", dict(resource), states=states, markers=markers)
        refused = Refusals()
        taken = experiment.take(batch, refused)
        assert taken is not None and refused.count == 0
        seqs = {
            s: log.append(s, encode_record(b"", p.resource, p.states, p.markers, p.samples))
            for s, p in taken.parts.items()
        }
        experiment.merge(taken, refused, seqs)
        for view in experiment.ready():  # as ``views.writes`` reports a written view
            views.append(view)
            for bucket, seq in view.carried.items():
                log.written_view(bucket, seq, -1, 0, force=True)
            log.written_view(view.step, view.seq, view.step, view.attempt, force=True)

    for second in range(4):
        clock.now = 1000.0 + second
        send([StateRows("sum", None, ["n"], [(1.0,)], time_unix_nano=int(clock.now * 1e9))], [])
    assert [(v.step, v.rewound) for v in views] == [(0, False)]  # bucket 0, final 2 s after it ended
    send([StateRows("sum", None, ["n"], [(1.0,)], time_unix_nano=1000 * 10**9 + 5)], [])  # late, for bucket 0
    for step in range(first, first + 2):
        send([StateRows("sum", step, ["n"], [(10.0,)])], [Marker(step, 0, False)])
        clock.now += 6.0
        send([], [])
    assert [(v.step, v.rewound) for v in views][1:] == [(first, first == 0), (first + 1, False)]  # 0: over bucket 0
    taken = {m.key: m.value for m in views[1].global_metrics}
    assert taken["n"] == 10.0 + (5.0 if first == 0 else 4.0 - first)  # its own and the buckets from it on
    assert set(views[1].carried) == {0, 1, 2, 3}  # bucket 0's late data below step 1: dropped, covered
    assert log.covered()
    log.close()
    assert list(ExperimentLog(tmp_path, "x", 1 << 20).replay()) == []


def test_a_sink_restarted_after_a_first_step_took_over_its_buckets_replays_none_of_them(tmp_path: Path) -> None:
    """The sink itself (its views report the carried buckets' records as written): a rank sends
    step-less values in three time buckets, then its first step; the step's view holds them all,
    and a sink started again on the state directory writes no step of its own for a bucket."""
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as mpb

    from rankscope.metrics.reduce import Reduce
    from rankscope.otlp.common import encode_resource
    from rankscope.sink import BookConfig, Sink, SinkConfig

    from .test_sink_steps import metrics, resource

    def sink(path: Path) -> Sink:
        book = BookConfig(grace=5.0, time_bucket=0.5, time_bucket_lag=30.0)  # every bucket still open at the marker
        views = {"jsonl": {"logging_mode": "global_reduce", "path": str(path)}}
        return Sink(SinkConfig(grpc_port=None, http_port=None, state_dir=tmp_path / "state", backends=views, book=book))

    def request(points: list[Any]) -> Any:
        out = mpb.ExportMetricsServiceRequest()
        rm = out.resource_metrics.add(resource=encode_resource(resource("p0", 0, 1)))
        rm.scope_metrics.add().metrics.extend(points)
        return out

    first = sink(tmp_path / "first.jsonl").start()
    try:
        now = time.time_ns()
        for i in range(3):  # buckets 0, 1 and 2
            first.export_metrics(request(metrics({"n": (Reduce.SUM, [1.0])}, None, at=now + i * 600_000_000)))
        first.export_metrics(request(metrics({"n": (Reduce.SUM, [10.0])}, step=0, at=now + 1_900_000_000)))
        first.finalize("x")
        assert first.wait_written("x")
    finally:
        first.stop()
    rows = [json.loads(line) for line in (tmp_path / "first.jsonl").read_text().splitlines()]
    assert {r["step"]: r["value"] for r in rows if r.get("key") == "n"} == {0: 13.0}
    again = sink(tmp_path / "again.jsonl").start()
    try:
        again.finalize("x")
        again.wait_written("x")
    finally:
        again.stop()
    replayed = tmp_path / "again.jsonl"
    assert not replayed.exists() or not [r for r in map(json.loads, replayed.read_text().splitlines()) if "key" in r]


def test_a_journal_folded_in_twice_never_moves_a_restarted_runs_frontier(tmp_path: Path) -> None:
    """A crash between the checkpoint and the journal's truncation leaves lines the checkpoint
    already holds: folding them in again, an older attempt's step does not move the frontier."""
    from rankscope.sink.testing import JOURNAL, ExperimentLog, atomic_write

    log = ExperimentLog(tmp_path, "x", 1 << 20)
    log.written_view(100, 5, 100, 0, force=True)
    log.written_view(102, 7, 102, 0)  # journaled (within 0.1 s of the checkpoint)
    log.written_view(3, 9, 3, 1)  # the run restarted: attempt 1 is at step 3
    state = {"written": {str(k): v for k, v in log.written.items()}, "last_finalized": 3, "attempt": 1, "seq": 9}
    atomic_write(tmp_path / "checkpoint.json", state)  # the checkpoint landed; the truncation did not
    assert len((tmp_path / JOURNAL).read_text().splitlines()) == 2
    again = ExperimentLog(tmp_path, "x", 1 << 20)
    assert (again.attempt, again.last_finalized) == (1, 3)


def write_log(directory: Path, records: int) -> Path:
    """A run's log of ``records`` synced records (step i: ``payload i``), closed; its segment."""
    from rankscope.sink.testing import WriteAheadLog

    wal = WriteAheadLog(directory)
    log = wal.open("e")
    for i in range(records):
        log.append(i, b"payload %d" % i)
    log.sync()
    segment = next(log.directory.glob("seg-*.log"))
    log.close()
    wal.close()
    return segment


def replayed_steps(directory: Path) -> tuple[list[int], list[str]]:
    """What a new sink's log of the run replays (steps), and what it set aside."""
    from rankscope.sink.testing import WriteAheadLog

    wal = WriteAheadLog(directory)
    log = wal.open("e")
    steps = [step for _, step, _ in log.replay()]
    log.close()
    wal.close()
    return steps, log.set_aside


def test_a_bad_record_before_the_end_sets_its_segment_aside_instead_of_cutting_it(tmp_path: Path) -> None:
    """Only the newest segment's last record can be torn by a crash (it was never acknowledged):
    that one is cut off. A bad record before the end is corruption of acknowledged records: it
    once truncated the segment from there, silently; now the records before it replay, the
    segment is kept as ``*.corrupt`` and the sink's status says so."""
    from rankscope.sink import Sink, SinkConfig

    segment = write_log(tmp_path, 5)
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a flipped bit in the middle: record 2 of 5
    segment.write_bytes(bytes(data))
    steps, set_aside = replayed_steps(tmp_path)
    assert steps == [0, 1] and "is corrupt at byte" in set_aside[0]
    assert not segment.exists() and segment.with_name(segment.name + ".corrupt").read_bytes() == bytes(data)

    sink = Sink(SinkConfig(grpc_port=None, http_port=None, state_dir=tmp_path)).start()  # nothing left to set aside
    try:
        assert not any("corrupt" in note for note in sink.overview()["run_notes"])
    finally:
        sink.stop()


def test_a_torn_last_record_is_cut_off_and_the_sink_says_a_set_aside_segment(tmp_path: Path) -> None:
    from rankscope.sink import Sink, SinkConfig

    segment = write_log(tmp_path, 3)
    whole = segment.read_bytes()
    segment.write_bytes(whole[:-3])  # the crash cut the last append
    assert replayed_steps(tmp_path) == ([0, 1], [])
    assert segment.exists() and len(segment.read_bytes()) < len(whole) - 3  # cut at the record's start

    data = bytearray(segment.read_bytes())
    data[30] ^= 0xFF  # now corrupt the first record: acknowledged data
    segment.write_bytes(bytes(data))
    sink = Sink(SinkConfig(grpc_port=None, http_port=None, state_dir=tmp_path)).start()
    try:
        notes = sink.overview()["run_notes"]
        assert any("is corrupt at byte 0" in note for note in notes), notes
    finally:
        sink.stop()


def test_a_corrupt_length_is_not_mistaken_for_a_torn_append(tmp_path: Path) -> None:
    """A flipped bit in a record's length made it look as if it ran past the end of the file, so
    the segment was cut there as a torn append, silently. A torn append is the last one: when an
    intact record follows, it is corruption, and the segment is set aside."""
    import struct

    from rankscope.sink.testing import HEADER

    segment = write_log(tmp_path, 5)
    data = bytearray(segment.read_bytes())
    record = HEADER.size + len(b"payload 0")
    (length,) = struct.unpack_from("<I", data, 2 * record)
    struct.pack_into("<I", data, 2 * record, length | 1 << 20)  # record 2 now claims a megabyte
    segment.write_bytes(bytes(data))
    steps, set_aside = replayed_steps(tmp_path)
    assert steps == [0, 1] and set_aside
    assert segment.with_name(segment.name + ".corrupt").read_bytes() == bytes(data)


def test_a_sink_from_before_the_dot_lock_still_keeps_a_new_one_out(tmp_path: Path) -> None:
    import fcntl

    import pytest

    from rankscope.sink.testing import StateDirBusyError, WriteAheadLog

    with open(tmp_path / "lock", "a") as old:  # an older sink's lock file, held
        fcntl.flock(old, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(StateDirBusyError, match="an older rankscope sink"):
            WriteAheadLog(tmp_path)
    WriteAheadLog(tmp_path).close()  # released: taken


# -- retired runs: a restart costs what is open, not the sink's history --------------------------

GRACE = 0.2


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def durable_sink(state: Path, views: Path, clock: Clock) -> Any:
    from rankscope.sink import BookConfig, RunLimits, Sink, SinkConfig

    config = SinkConfig(
        grpc_port=None,
        http_port=None,
        tick=3600.0,  # the test runs the finalizer's rounds
        state_dir=state,
        backends={"jsonl": {"logging_mode": "global_reduce", "path": str(views)}},
        runs=RunLimits(quiet_after=30.0, idle_timeout=120.0),
        book=BookConfig(grace=GRACE, start_hold=0.0),
    )
    return Sink(config, clock=clock).start()


def request(run: str, steps: list[int], *, goodbye: bool = False, attempt: int = 0) -> Any:
    """Rank 0 of a one-rank run: ``loss`` = the step at each of ``steps``, its markers (and goodbye)."""
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as mpb

    from rankscope.core import names as attr
    from rankscope.otlp.common import encode_resource, key_value
    from rankscope.otlp.raw import parse_metrics

    r = mpb.ExportMetricsServiceRequest()
    resource = {
        attr.EXPERIMENT_ID: "exp",
        attr.RUN_ID: run,
        attr.SERVICE_INSTANCE_ID: f"{run}-{attempt}",
        attr.RANK: "0",
        attr.WORLD_SIZE: "1",
        attr.EXPERIMENT_ATTEMPT: attempt,
    }
    metrics = r.resource_metrics.add(resource=encode_resource(resource)).scope_metrics.add().metrics
    for step in steps:
        point = metrics.add(name="loss").gauge.data_points.add(as_double=float(step))
        point.attributes.extend([key_value(attr.REDUCE, "max"), key_value(attr.STEP, step)])
        metrics.add(name=attr.FLUSH_MARKER).sum.data_points.add(as_int=1, attributes=[key_value(attr.STEP, step)])
    if goodbye:
        metrics.add(name=attr.GOODBYE).sum.data_points.add(as_int=1)
    return parse_metrics(r.SerializeToString())


def settle(sink: Any) -> None:
    """A round of the finalizer, then the views write and the closer closes what it was handed."""
    sink.upkeep.round()
    for tenant in sink.tenants.all():
        if tenant.writer is not None:
            assert tenant.writer.wait_idle(10)
    deadline = time.monotonic() + 10
    while sink.closer.closing and time.monotonic() < deadline and "closer" not in sink.supervisor.dead:
        time.sleep(0.01)


def close_ended(sink: Any, clock: Clock) -> None:
    """Let the runs that said goodbye close: past the grace (and its margin) on the sink's clock."""
    from rankscope.sink.testing import ENDED_MARGIN

    settle(sink)
    clock.now += GRACE + ENDED_MARGIN + 0.1
    settle(sink)


def past_linger(since: float) -> None:
    """The run book refuses an ended run's id once the grace passed on the wall clock."""
    time.sleep(max(0.0, since + GRACE + 0.05 - time.time()))


def runs_kept(state: Path) -> list[str]:
    """What the state directory holds besides its lock and the store of retired runs."""
    return sorted(str(p.relative_to(state)) for p in state.rglob("*") if p.name not in (".lock", ".retired.log"))


def loss_rows(views: Path) -> list[tuple[str, int, float]]:
    if not views.exists():
        return []
    rows = map(json.loads, views.read_text().splitlines())
    return sorted((r["run"], r["step"], r["value"]) for r in rows if r.get("key") == "loss")


def test_a_run_that_ended_is_retired_when_it_closes_and_a_restart_reads_only_the_store(tmp_path: Path) -> None:
    """A run whose views wrote everything leaves no directory when it closes: its status, where its
    steps were and its run book record are in the store of retired runs, which is all a restarted
    sink reads of it. The restarted sink answers its status, refuses its id's reuse, takes the
    retry of its goodbye as taken, merges nothing twice, and a run closed idle goes on where it was."""
    state, views, clock = tmp_path / "state", tmp_path / "views.jsonl", Clock()
    sink = durable_sink(state, views, clock)
    try:
        bye = request("ended", [0, 1, 2], goodbye=True)
        assert sink.export_metrics(bye).rejected == 0
        said = time.time()
        assert sink.export_metrics(request("idle", [0, 1])).rejected == 0
        close_ended(sink, clock)
        clock.now += 121.0  # the idle run closes too: its steps were all written
        settle(sink)
        assert sink.tenants.all() == [] and runs_kept(state) == [], runs_kept(state)
        assert sink.closed.retired == 2
        status = sink.status("exp", "ended")
        assert status is not None and (status["open"], status["last_finalized_step"]) == (False, 2)
        assert {r["run"]: r["last_finalized_step"] for r in status["runs"]} == {"ended": 2, "idle": 1}
    finally:
        sink.stop()
    assert sink.internal_errors == []

    again = durable_sink(state, tmp_path / "again.jsonl", clock)
    try:
        status = again.status("exp", "ended")
        assert status is not None and (status["open"], status["last_finalized_step"], status["points"]) == (False, 2, 3)
        assert {r["run"]: r["ended"] for r in status["runs"]} == {"ended": True, "idle": False}
        assert {r["run"]: r["last_finalized_step"] for r in status["runs"]} == {"ended": 2, "idle": 1}
        past_linger(said)
        assert again.export_metrics(bye).rejected == 0  # a retry of its goodbye, after the grace: taken
        reused = again.export_metrics(request("ended", [3]))
        assert reused.rejected == 2 and "another launch reuses its id" in reused.message
        assert again.export_metrics(request("idle", [1, 2])).rejected == 0  # step 1 is late: it was written
        settle(again)
        idle = again.status("exp", "idle")
        assert idle is not None and (idle["last_finalized_step"], idle["late_points"]) == (2, 1)
    finally:
        again.stop()
    assert again.internal_errors == []
    assert loss_rows(views) == [("ended", s, float(s)) for s in range(3)] + [("idle", s, float(s)) for s in range(2)]
    assert [row for row in loss_rows(tmp_path / "again.jsonl") if row[1] == 2] == [("idle", 2, 2.0)]


class Crash(BaseException):
    """The SIGKILL: raised by the closer thread's n-th file system call, before it is made."""


CALLS = ("open", "write", "fsync", "close", "unlink", "rmdir", "replace", "rename", "truncate")


def crash_closer_at(n: int, monkeypatch: Any) -> list[int]:
    """The closer thread dies before its ``n``-th call that touches the disk (what the kill leaves
    is the disk as it is: a SIGKILL loses nothing a call already wrote). Returns the count so far."""
    import threading

    made = [0]
    for name in CALLS:
        real = getattr(os, name)

        def call(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            if threading.current_thread().name == "rankscope-sink-closer":
                if made[0] >= n:
                    raise Crash
                made[0] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(os, name, call)
    return made


def test_a_kill_at_any_point_of_a_retirement_loses_nothing_and_merges_nothing_twice(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Retiring a run writes in an order that a SIGKILL cannot break: its log closes (no
    checkpoint: its journal says what was written), the store's entry is made durable, then its
    files go, ``meta.json`` first. The closer is killed before each of its disk calls in turn; a
    sink started on what the kill left replays none of the run's steps (each was written once),
    keeps no directory of it, knows the run (its id's reuse refused, its goodbye's retry taken) and
    its status once the store's entry was written."""
    import shutil

    points = 0
    statuses = set()
    for n in range(200):
        case = tmp_path / str(n)
        state, views, clock = case / "state", case / "views.jsonl", Clock()
        sink = durable_sink(state, views, clock)
        bye = request("r", [0, 1, 2], goodbye=True)
        with monkeypatch.context() as patch:
            try:
                assert sink.export_metrics(bye).rejected == 0
                said = time.time()
                settle(sink)
                made = crash_closer_at(n, patch)
                close_ended(sink, clock)
                killed = "closer" in sink.supervisor.dead
                shutil.copytree(state, case / "left", ignore=shutil.ignore_patterns(".lock"))
            finally:
                patch.undo()
                sink.stop()
        again = durable_sink(case / "left", case / "again.jsonl", Clock())
        try:
            status = again.status("exp", "r")
            statuses.add(status is not None)
            assert status is None or status["last_finalized_step"] == 2
            assert runs_kept(case / "left") in ([], [".retired"]), (n, runs_kept(case / "left"))
            past_linger(said)
            assert again.export_metrics(bye).rejected == 0, n
            assert again.export_metrics(request("r", [3])).rejected == 2, n
        finally:
            again.stop()
        assert again.internal_errors == []
        assert loss_rows(views) == [("r", 0, 0.0), ("r", 1, 1.0), ("r", 2, 2.0)]
        assert loss_rows(case / "again.jsonl") == [], n  # nothing replayed: each step was written once
        shutil.rmtree(case)
        if not killed:  # past the last call: retired whole
            assert made[0] <= n and runs_kept(state) == []
            break
        points += 1
    assert points >= 10 and statuses == {True, False}, (points, statuses)


def test_the_store_of_retired_runs_stays_bounded_and_reads_back_after_a_torn_append(tmp_path: Path) -> None:
    """Each table keeps its newest keys; a later line replaces an earlier one; a line a crash cut is
    skipped and the next batch starts a line of its own; once the journal outgrows the snapshot the
    two are folded (a crash between the snapshot's rename and the journal's emptying folds it twice:
    the same values)."""
    from rankscope.sink.testing import RetiredStore

    limits = {"runs": 50, "statuses": 5}
    store = RetiredStore(tmp_path, limits, compact_bytes=2000)
    for i in range(120):
        store.put("runs", ["exp", f"r{i}"], {"i": i})
        store.put("statuses", ["exp", f"r{i}"], {"i": i})
        if i % 10 == 9:
            store.save()
    store.put("runs", ["exp", "r100"], {"i": "again"})
    store.save()
    assert store.compactions > 0 and store.pending == 0
    with open(tmp_path / ".retired.log", "ab") as journal:
        journal.write(b'["runs",["exp","torn"],{"i"')  # the crash cut this append

    again = RetiredStore(tmp_path, limits, compact_bytes=2000)
    tables = again.load()
    assert list(tables["runs"]) == [("exp", f"r{i}") for i in [*range(70, 100), *range(101, 120), 100]]
    assert tables["runs"][("exp", "r100")] == {"i": "again"}
    assert list(tables["statuses"]) == [("exp", f"r{i}") for i in range(115, 120)]
    again.put("runs", ["exp", "after"], {"i": 0})
    again.save()
    found = RetiredStore(tmp_path, limits).load()["runs"]
    assert ("exp", "after") in found and ("exp", "torn") not in found

    journal = (tmp_path / ".retired.log").read_bytes()
    again.compact()
    assert (tmp_path / ".retired.log").read_bytes() == b""
    (tmp_path / ".retired.log").write_bytes(journal)  # as if a crash came before the journal was emptied
    assert RetiredStore(tmp_path, limits).load()["runs"] == found


def test_a_log_is_covered_only_once_every_record_it_holds_is_written(tmp_path: Path) -> None:
    """What decides that a closing run's directory may go: every record in a written view, and no
    segment on disk the log never read (an earlier life's, not replayed)."""
    from rankscope.sink.testing import ExperimentLog

    log = ExperimentLog(tmp_path / "run", "x", 1 << 20)
    assert log.fresh and log.covered()
    seqs = [log.append(step, b"record") for step in range(3)]
    log.sync()
    log.written_view(0, seqs[0], 0, 0)
    log.written_view(1, seqs[1], 1, 0)
    assert not log.covered()
    log.written_view(2, seqs[2], 2, 0)
    assert log.covered()
    log.close(checkpoint=False)  # no checkpoint: the journal says what a log opened here needs
    reopened = ExperimentLog(tmp_path / "run", "x", 1 << 20)
    assert not reopened.fresh and reopened.seq == seqs[2] and reopened.last_finalized == 2
    assert not reopened.covered()  # the segments of the log before it, never read by this one
    assert list(reopened.replay()) == [] and reopened.covered()
    reopened.close(checkpoint=False)
    reopened.remove()
    assert not (tmp_path / "run").exists()


def test_a_state_directory_of_the_sink_before_retiring_is_taken_over_and_compacted(tmp_path: Path) -> None:
    """The upgrade: a state directory where the sink before kept every run's directory, closed runs'
    too. Those with nothing to replay are retired on the first start (their run book records and
    tombstones kept: an ended run's id stays taken); one with an acknowledged record its views had
    not written is replayed into its run as before, its step written once, and retired when it closes."""
    from rankscope.core import names as attr
    from rankscope.otlp.markers import Marker
    from rankscope.sink.testing import StateRows, WriteAheadLog, encode_record

    state, clock = tmp_path / "state", Clock()
    wal = WriteAheadLog(state)
    for i in range(20):  # closed runs, as the sink before left them: meta.json and a checkpoint
        log = wal.open("exp", f"old-{i}")
        log.save_meta({"started": 100.0 + i, "owner": "", "ended": [0, 100.0 + i], "goodbyes": [], "version": 1})
        seq = log.append(0, b"written")
        log.sync()
        log.written_view(0, seq, 0, 0)
        log.close()
    log = wal.open("exp", "pending")  # killed after it acknowledged step 0, before its view was written
    log.save_meta({"started": 200.0, "owner": "", "version": 1})
    resource = {attr.EXPERIMENT_ID: "exp", attr.RUN_ID: "pending", attr.SERVICE_INSTANCE_ID: "pending-0"}
    resource |= {attr.RANK: "0", attr.WORLD_SIZE: "1", attr.EXPERIMENT_ATTEMPT: 0}
    log.append(0, encode_record(b"d" * 16, resource, [StateRows("sum", 0, ["loss"], [(7.0,)])], [Marker(0, 1, False)]))
    log.sync()
    wal.close()
    assert len(runs_kept(state)) > 40

    sink = durable_sink(state, tmp_path / "views.jsonl", clock)
    try:
        assert [d for d in runs_kept(state) if "old" in d] == []
        reused = sink.export_metrics(request("old-3", [1]))
        assert reused.rejected == 2 and "another launch reuses its id" in reused.message
        assert sink.export_metrics(request("pending", [], goodbye=True)).rejected == 0
        close_ended(sink, clock)
        assert runs_kept(state) == [] and sink.status("exp", "pending") is not None
    finally:
        sink.stop()
    assert sink.internal_errors == []
    assert loss_rows(tmp_path / "views.jsonl") == [("pending", 0, 7.0)]
