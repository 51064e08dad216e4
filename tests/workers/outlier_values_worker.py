"""A process of the outlier tests (``tests/e2e/test_outliers.py``), no torch: noisy values of one
experiment, two of them made to diverge from known steps.

    python outlier_values_worker.py STEPS [PAUSE_S]

``loss`` (MEAN of 4 samples around 1.0, spread 0.01) and ``grad_norm`` (MEAN around 2.0, spread
0.05), seeded by rank and step; rank 13's loss is +0.8 from step 5 and rank 27's grad norm 3x
from step 8; ``tokens`` (SUM) differs by rank by design.
"""

import os
import random
import sys
import time

import rankscope as rs

steps = int(sys.argv[1])
pause = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
rs.init(role="trainer")
rank = int(os.environ.get("RANK", "0"))
start = float(os.environ.get("TREE_START_AT", time.time()))
time.sleep(max(0.0, start - time.time()))
for step in range(steps):
    rng = random.Random(rank * 1000 + step)
    for _ in range(4):
        rs.record_metric("loss", rng.gauss(1.0, 0.01) + (0.8 if rank == 13 and step >= 5 else 0.0))
    rs.record_metric("grad_norm", rng.gauss(2.0, 0.05) * (3.0 if rank == 27 and step >= 8 else 1.0))
    rs.record_metric("tokens", 100 + rank * 10, rs.Reduce.SUM)
    rs.flush(step)
    time.sleep(max(0.0, start + (step + 1) * pause - time.time()))
rs.shutdown()
print(f"dropped={rs.dropped_points()}", flush=True)
