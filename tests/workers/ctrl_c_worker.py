"""A torchrun rank that steps until it is interrupted (tests/e2e/test_console.py presses Ctrl-C).

Each step records its values first, then spends most of its time in a traced phase, so the
interrupt lands inside a step that some ranks may have closed and others not.
"""

import os
import time

import torch.distributed as dist

import rankscope as rs


def main() -> None:
    dist.init_process_group("gloo")
    rs.init(experiment="ctrl-c")
    rank = dist.get_rank()
    print(f"rank {rank} pid {os.getpid()} stepping", flush=True)  # torchrun starts ranks in sessions of their own
    for step in range(10_000):
        rs.record_metric("loss", 1.0 / (step + 1))
        with rs.trace("train") as t:
            time.sleep(0.2)
            t.step("forward")
            time.sleep(0.1)
            t.step("backward")
        rs.flush(step)


if __name__ == "__main__":
    main()
