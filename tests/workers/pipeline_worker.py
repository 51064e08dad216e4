"""A process of a pipeline test: known values and a traced phase per step, exported to RANKSCOPE_ENDPOINT.

    python pipeline_worker.py ROLE STEPS [PAUSE_S]

Records ``{role}/value`` = rank + step (MEAN) and ``{role}/count`` = 1 (SUM) per step, prints
how many points it had to drop. With WORKER_PROGRESS set, writes the number of steps done to that
file after each step (so a test can see the loop going on while telemetry has nowhere to go).
"""

import os
import sys
import time

import rankscope as rs

role, steps = sys.argv[1], int(sys.argv[2])
pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
progress = os.environ.get("WORKER_PROGRESS")
rs.init(role=role)
rank = int(os.environ.get("RANK", "0"))
for step in range(steps):
    with rs.trace(role) as t:
        rs.record_metric(f"{role}/value", float(rank + step), rs.Reduce.MEAN)
        rs.record_metric(f"{role}/count", 1, rs.Reduce.SUM)
        t.step("work")
    rs.flush(step)
    if progress:
        with open(f"{progress}.tmp", "w") as f:
            f.write(str(step + 1))
        os.replace(f"{progress}.tmp", progress)
    time.sleep(pause)
rs.shutdown()
print(f"dropped={rs.dropped_points()}", flush=True)
