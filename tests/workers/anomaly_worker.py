"""A torchrun rank for the anomaly tests (``tests/test_anomalies.py``).

``nan STEPS``: rank 2 records NaN as ``loss`` at step 3 (every other value is finite).
``straggler STEPS``: rank 1 sleeps 0.3 s inside the ``fwd`` phase from step 5 on.
``steady STEPS``: every rank alike, 0.1 s a step (a job to capture from a shell).
``self STEPS``: steady, and rank 3 asks for a one-step capture of itself at step 3 (``rs.capture``).
"""

from __future__ import annotations

import sys
import time

import torch.distributed as dist

import rankscope as rs


def main(mode: str, steps: int) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    rs.init(role="trainer")
    for step in range(steps):
        with rs.trace("train") as t:
            time.sleep(0.01)
            if mode == "straggler" and rank == 1 and step >= 5:
                time.sleep(0.3)
            if mode in ("steady", "self"):
                time.sleep(0.1)
            if mode == "self" and rank == 3 and step == 3:
                rs.capture("rank 3 wants a look", steps=1, ranks=[3])
            t.step("fwd")
            time.sleep(0.01)
            t.step("bwd")
        loss = float("nan") if (mode == "nan" and rank == 2 and step == 3) else 1.0 + rank
        rs.record_metric("loss", loss)
        rs.record_metric("grad_norm", 0.5, rs.Reduce.MAX)
        dist.barrier()
        rs.flush(step)
    rs.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
