"""The tutorial's script (docs/tutorial.md): your own 2-rank torchrun job, with rankscope added.

torchrun --standalone --nproc_per_node=2 examples/mytrain.py [--steps 30]
"""

import argparse
import time

import torch
import torch.distributed as dist

import rankscope as rs

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
model = torch.nn.Linear(16, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

for step in range(args.steps):
    with rs.trace("train") as t:  # the step's phases, on every rank's timeline
        x = torch.randn(64, 16)
        loss = (model(x) - 1).pow(2).mean()
        time.sleep(0.05)  # your real forward pass takes a while
        t.step("forward")
        optimizer.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)  # seen: who arrived last, who waited
            p.grad /= dist.get_world_size()
        t.step("backward")
        optimizer.step()
    rs.record_metric("loss", loss.detach())  # MEAN across ranks by default
    rs.record_metric("samples", 64, rs.Reduce.SUM)
    rs.flush(step)  # closes the step on this rank
dist.destroy_process_group()
