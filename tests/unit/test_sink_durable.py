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
    from rankscope.sink.wal import WriteAheadLog

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
    from rankscope.sink.wal import JOURNAL, ExperimentLog

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
