"""A torchrun rank for the outlier tests (``tests/e2e/test_outliers.py``): data-parallel training of
one small model, each rank on its own batches, gradients averaged with an all-reduce; each step
records the rank's ``loss`` and ``grad_norm`` (MEAN) and its ``samples`` (SUM) and flushes.

    outlier_worker.py --steps 30 --diverge 1:10:5.0

``--diverge RANK:FROM:OFFSET``: that rank's recorded loss is OFFSET higher from step FROM on (a
bad data shard, a corrupting device): the others' values are untouched.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

import rankscope as rs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--diverge", default="", help="RANK:FROM:OFFSET")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    rs.init(role="trainer")
    who, since, offset = (
        (int(args.diverge.split(":")[0]), int(args.diverge.split(":")[1]), float(args.diverge.split(":")[2]))
        if args.diverge
        else (-1, 0, 0.0)
    )
    torch.manual_seed(0)
    target = torch.randn(16, 1)
    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(100 + rank)
    for step in range(args.steps):
        x = torch.randn(64, 16, generator=generator)
        y = x @ target + 0.1 * torch.randn(64, 1, generator=generator)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        for p in model.parameters():
            assert p.grad is not None
            dist.all_reduce(p.grad)
            p.grad /= world
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
        optimizer.step()
        recorded = loss.item() + (offset if rank == who and step >= since else 0.0)
        rs.record_metric("loss", recorded)
        rs.record_metric("grad_norm", norm.item())
        rs.record_metric("samples", 64, rs.Reduce.SUM)
        rs.flush(step)
    rs.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
