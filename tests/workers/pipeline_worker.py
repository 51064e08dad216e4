"""A process of a pipeline test: known values and a traced phase per step, exported to RANKSCOPE_ENDPOINT.

    python pipeline_worker.py ROLE STEPS [PAUSE_S]

Records ``{role}/value`` = rank + step (MEAN) and ``{role}/count`` = 1 (SUM) per step, prints
how long it ran and how many points it had to drop.
"""

import os
import sys
import time

import rankscope as rs

role, steps = sys.argv[1], int(sys.argv[2])
pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
started = time.monotonic()
rs.init(role=role)
rank = int(os.environ.get("RANK", "0"))
for step in range(steps):
    with rs.trace(role) as t:
        rs.record_metric(f"{role}/value", float(rank + step), rs.Reduce.MEAN)
        rs.record_metric(f"{role}/count", 1, rs.Reduce.SUM)
        t.step("work")
    rs.flush(step)
    time.sleep(pause)
loop_s = time.monotonic() - started
rs.shutdown()
print(f"loop_s={loop_s:.2f} dropped={rs.dropped_points()}", flush=True)
