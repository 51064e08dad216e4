"""Traced SPMD steps: one trace per step across ranks, a straggler view, a Gantt file.

    rankscope run --gantt steps.json -- torchrun --standalone --nproc_per_node=4 examples/traced_torchrun.py

Each rank runs 6 steps of data / fwd / bwd phases; rank 3 is slow in fwd. The sink prints each
step's global view, including ``straggler/train/fwd/late_rank: 3.0``, names rank 3 a straggler
once its first 3 steps (warm-up) are past, and ``--gantt`` writes a Perfetto file
(https://ui.perfetto.dev): one track per rank, the phases nested in each step.
"""

import os
import time

import torch

import rankscope as rs

rank = int(os.environ.get("RANK", "0"))
model = torch.nn.Linear(256, 256)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

for step in range(6):
    with rs.trace("train") as t:
        x = torch.randn(64, 256)
        t.step("data")
        loss = model(x).pow(2).mean()
        if rank == 3:
            time.sleep(0.5)  # the straggler (a loaded 2-core box once stalled another rank 0.3 s)
        t.step("fwd")
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        t.step("bwd")
    rs.record_metric("loss", loss.detach())
    rs.flush(step)
rs.shutdown()
