"""A process of the tree tests: every built-in reduce type with exact values per step.

    python tree_worker.py ROLE STEPS [PAUSE_S]

Steps start at ``TREE_START_AT`` (epoch seconds), or, with ``TREE_READY_DIR``, one second after
the last of ``TREE_PROCESSES`` processes has initialized (each leaves a file there).

Values depend only on role, rank and step, and are multiples of 1/4 small enough that every
sum is exact in any order: the same processes sent through the Collector tree and straight to
the sink must give identical views. ``spike`` (MAX) and ``floor`` (MIN) put their extreme on a
rank that moves with the step.
"""

import os
import sys
import time
from pathlib import Path

import rankscope as rs

role, steps = sys.argv[1], int(sys.argv[2])
pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
rs.init(role=role)
rank = int(os.environ.get("RANK", "0"))
size = int(os.environ.get("WORLD_SIZE", "1"))
salt = {"trainer": 0, "generator": 1, "replay": 2}.get(role, 3)
start = float(os.environ.get("TREE_START_AT", time.time()))
ready = os.environ.get("TREE_READY_DIR")
if ready:  # all start together once every process has initialized (32 take 13 s of CPU on 2 cores)
    Path(ready, str(os.getpid())).touch()
    deadline = time.time() + 120
    while len(os.listdir(ready)) < int(os.environ["TREE_PROCESSES"]) and time.time() < deadline:
        time.sleep(0.05)
    start = max(p.stat().st_mtime for p in Path(ready).iterdir()) + 1.0  # the same for all: the last one's
time.sleep(max(0.0, start - time.time()))
R = rs.Reduce
for step in range(steps):
    base = (rank * 3 + salt * 5 + step * 7) % 17
    for i in range(3):
        value = (base + i) / 4 - 2
        for key, reduce in (("mean", R.MEAN), ("std", R.STD), ("sum", R.SUM), ("max", R.MAX), ("min", R.MIN)):
            rs.record_metric(f"v/{key}", value, reduce)
        rs.record_metric("v/count", value, R.COUNT)
        rs.record_metric("v/dist", value, R.DISTRIBUTION)
    rs.record_metric("v/last", step + 0.5, R.LAST)  # the same everywhere: which one is last is timing
    rs.record_metric(f"{role}/samples", 8, R.SUM)
    rs.record_metric("spike", 100.0 if rank == step % size else float(rank), R.MAX)
    rs.record_metric("floor", -100.0 if rank == (step + 1) % size else float(rank), R.MIN)
    rs.flush(step)
    time.sleep(max(0.0, start + (step + 1) * pause - time.time()))
rs.shutdown()
print(f"dropped={rs.dropped_points()}", flush=True)
