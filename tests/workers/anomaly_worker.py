"""A torchrun rank for the anomaly tests (``tests/test_anomalies.py``).

``nan STEPS``: rank 2 records NaN as ``loss`` at step 3 (every other value is finite).
``straggler STEPS``: rank 1 sleeps 0.3 s inside the ``fwd`` phase from step 5 on.
``steady STEPS``: every rank alike, 0.1 s a step (a job to capture from a shell).
``self STEPS``: steady, and rank 3 asks for a one-step capture of itself at step 3 (``rs.capture``).
``last STEPS``: steady, rank 3 asks as in ``self``, and every rank ends at the flush that stops
rank 3's profiler (at most STEPS steps): the capture's trace is then sent only by shutdown.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist

import rankscope as rs
from rankscope.lifecycle.driving import installed


def _profiled() -> bool:
    """This process's capture has stopped profiling (its trace not yet sent)."""
    runtime = installed()
    captures = runtime.thread.captures if runtime is not None else None
    return captures is not None and bool(captures._finished or getattr(captures, "_uploads", ()))


def main(mode: str, steps: int) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    rs.init(role="trainer")
    for step in range(steps):
        with rs.trace("train") as t:
            time.sleep(0.01)
            if mode == "straggler" and rank == 1 and step >= 5:
                time.sleep(0.3)
            if mode in ("steady", "self", "last"):
                time.sleep(0.1)
            if mode in ("self", "last") and rank == 3 and step == 3:
                rs.capture("rank 3 wants a look", steps=1, ranks=[3])
            t.step("fwd")
            time.sleep(0.01)
            t.step("bwd")
        loss = float("nan") if (mode == "nan" and rank == 2 and step == 3) else 1.0 + rank
        rs.record_metric("loss", loss)
        rs.record_metric("grad_norm", 0.5, rs.Reduce.MAX)
        dist.barrier()
        rs.flush(step)
        if mode == "last":
            done = torch.tensor([1.0 if _profiled() else 0.0])
            dist.all_reduce(done)
            if done.item():
                break
    rs.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
