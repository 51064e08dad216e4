"""Nothing acknowledged is lost: SIGKILL the sink at a random moment, restart it on the same ports.

Four real SDK processes (``RANK`` 0..3 of one experiment, OTLP/gRPC to a ``rankscope sink``
process with a state directory) each record 1 per step as SUM and flush 30 steps. The sink is
killed with SIGKILL at a seeded random moment and restarted on the same ports; the SDK holds its
steps while the sink is down and sends them when it answers again. Each rank also offers a
sample row per step (``rank_by`` its rank, k=1): the rows are merged across ranks like points
and must survive the kill too. The ranks run at different
paces, so at any moment the sink holds acknowledged steps that are not yet written (they wait for
the slowest rank): those live only in the write-ahead log. Every step must be in the
final view exactly once: a step merged twice would read 8, a lost one 3.
"""

from __future__ import annotations

import json
from pathlib import Path

STEPS = 30
RANKS = 4

JOB = """
import os, time, rankscope as rs
pace = 0.05 * (1 + int(os.environ["RANK"]))  # rank 0 runs ahead: its steps are acknowledged, not yet written
rank = int(os.environ["RANK"])
for step in range(%d):
    rs.record_metric("ones", 1, rs.Reduce.SUM)
    rs.record_sample("ranks", {"r": rank, "s": step}, rank_by="r", k=1)
    rs.flush(step)
    time.sleep(pace)
rs.shutdown()  # waits (bounded) for every held step to be answered
print("dropped", rs.dropped_points())
"""






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
