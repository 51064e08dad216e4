"""The torchtitan step loop of ``examples/torchtitan_metrics.py`` (real structured logger, metric
classes and loss reductions; CPU memory monitor), run under torchrun (2 processes, gloo).

argv: steps, a directory. Each process writes ``report-<rank>.json`` there: its rank and what its
``MetricsProcessor`` logged at each step (through a logger beside rankscope's in torchtitan's container).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist

import rankscope as rs

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from torchtitan_metrics import train  # the example's loop, as the docs show it

dist.init_process_group("gloo")
logged = train(int(sys.argv[1]), sys.argv[2])
rank = dist.get_rank()
dist.destroy_process_group()
rs.shutdown()
(Path(sys.argv[2]) / f"report-{rank}.json").write_text(json.dumps({"rank": rank, "logged": logged}))
