"""A rank of the multi-node torchrun job of the cluster tests (``tests/e2e/test_cluster.py``).

    python cluster_worker.py DIR STEPS PAUSE_S

Each step it records values that depend only on its rank, the world's size and the step (dyadic:
sums are exact in any order), joins one gloo all-reduce with every rank on every node, flushes
the step to its node's agent, and appends what it recorded to its own log
(``DIR/ranks/a{attempt}-r{rank}.jsonl``, one line per flushed step, written before the next
step begins): the record each test judges the sink's views against. A line marked ``recorded``
comes before the step's all-reduce: a rank that torchrun's SIGTERM stops before the step's own
line leaves it alone (rankscope still sends what was recorded: flushed, in its step, or not yet
flushed, without a step, placed by its time), and the step's values may be in the views.
Rank 0 keeps the last step the whole job finished in ``DIR/checkpoint`` (after the all-reduce: every rank reached it); a
job restarted by torchrun (a new attempt: the rendezvous round) resumes after it, as a
job resumes from its checkpoint.
"""

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

import rankscope as rs

directory, steps, pause = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
dist.init_process_group("gloo", timeout=timedelta(seconds=300))
rank, size = dist.get_rank(), dist.get_world_size()
rs.init(role="trainer")
attempt = rs.get_resource().attributes["rankscope.experiment.attempt"]  # the rendezvous round
checkpoint = directory / "checkpoint"
first = int(checkpoint.read_text()) + 1 if checkpoint.exists() else 0
log = (directory / "ranks" / f"a{attempt}-r{rank}.jsonl").open("a")
R = rs.Reduce
for step in range(first, steps):
    started = time.monotonic()
    value = ((rank * 5 + step * 3) % 13) / 4
    recorded = {
        "v/sum": (value, R.SUM),
        "v/mean": (value, R.MEAN),
        "v/max": (value, R.MAX),
        "v/min": (value, R.MIN),
        "samples": (1.0, R.SUM),  # the world's size when every rank counts once: a value merged twice shows
    }
    for key, (v, reduce) in recorded.items():
        rs.record_metric(key, v, reduce)
    node = os.environ["CLUSTER_NODE"]
    values = {k: v for k, (v, _) in recorded.items()}
    log.write(json.dumps({"step": step, "rank": rank, "size": size, "node": node, "values": values, "recorded": True}))
    log.write("\n")
    log.flush()
    together = torch.tensor([1.0])
    dist.all_reduce(together)  # the job is one: a rank cut off holds every other rank here
    rs.flush(step)
    flushed = time.time()  # when: a test's failure says how far apart the ranks went on after a fault
    log.write(json.dumps({"step": step, "rank": rank, "size": size, "node": node, "values": values, "at": flushed}))
    log.write("\n")
    log.flush()
    if rank == 0:
        checkpoint.write_text(str(step))
    time.sleep(max(0.0, pause - (time.monotonic() - started)))
rs.shutdown()
dist.destroy_process_group()
