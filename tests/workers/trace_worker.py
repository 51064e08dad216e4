"""A torchrun rank for the tracing tests: 3 steps of a traced train step; rank 3 is the straggler."""

import os
import time

import rankscope as rs

rs.init()
rank = int(os.environ["RANK"])
for step in range(3):
    with rs.trace("train") as t:
        time.sleep(0.06 if rank == 3 else 0.002)  # forward: a 30x straggler, >3x even on a loaded box
        t.step("fwd")
        time.sleep(0.001)  # backward
        t.step("bwd")
    rs.flush(step)
rs.shutdown()
