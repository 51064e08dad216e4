"""A torchrun rank that dies once (``tests/e2e/test_runs_torchrun.py``).

``elastic_worker.py STEPS CHECKPOINT DIE_AFTER``: 2 ranks record ``loss = 10 * step + attempt +
rank`` and one sample row a step. In attempt 0 the ranks meet after flushing step DIE_AFTER
(files in the working directory), then rank 1 crashes while rank 0 waits (as at a collective)
until torchrun (``--max-restarts 1``) stops it and starts both again as attempt 1, which resumes
from its checkpoint: the steps after CHECKPOINT are executed again, with values that say so. No
process group: gloo under ``--standalone`` reconnected to the dead rank's address after the
restart (torch 2.15), and the test is about what reaches the sink.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import rankscope as rs


def main(steps: int, checkpoint: int, die_after: int) -> None:
    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    rs.init(role="trainer")
    for step in range(0 if attempt == 0 else checkpoint + 1, steps):
        rs.record_metric("loss", 10.0 * step + attempt + rank)
        rs.record_sample("rollouts", {"attempt": attempt, "step": step, "rank": rank})
        rs.flush(step)
        if attempt == 0 and step == die_after:
            rs.force_flush(10)
            here = Path(f"rank{rank}-at-{die_after}")
            here.touch()  # the ranks meet here (no process group): both flushed DIE_AFTER first
            other = Path(f"rank{1 - rank}-at-{die_after}")
            deadline = time.monotonic() + 120
            while not other.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            if rank == 1:
                os._exit(1)  # a crash: no shutdown, no goodbye
            time.sleep(120)  # rank 0 waits for rank 1 until torchrun stops it
    rs.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
