"""Nothing acknowledged is lost across an upgrade: a state directory from a sink before running
merges (record version 1, one state dict per point) still replays, in process.

The SIGKILL test of a sink process is ``tests/integration/test_sink_durable.py``."""

from __future__ import annotations

import json
from pathlib import Path


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
