"""A torchrun rank for the sink tests: known values per rank and step, no endpoint configured."""

import json
import os
import sys

import rankscope as rs

views = json.loads(sys.argv[1])
rs.init(backends=views)
rank = int(os.environ["RANK"])
for step in range(3):
    for value in (rank + step, 2 * rank + step):
        rs.record_metric("loss", float(value), rs.Reduce.MEAN)
        rs.record_metric("loss_std", float(value), rs.Reduce.STD)
        rs.record_metric("loss_max", float(value), rs.Reduce.MAX)
    rs.record_metric("samples", 8, rs.Reduce.SUM)
    rs.record_metric("spike", 10.0 if rank == step % 4 else float(rank), rs.Reduce.MAX)  # argmax moves
    rs.record_metric("floor", -1.0 if rank == (step + 1) % 4 else float(rank), rs.Reduce.MIN)
    rs.flush(step)
rs.shutdown()
