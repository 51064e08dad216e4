"""A plain DDP training script (gloo, CPU) with no rankscope import at all.

    opentelemetry-instrument torchrun --standalone --nproc_per_node=2 examples/ddp_plain.py

Under ``opentelemetry-instrument`` (or ``rankscope run --instrument``) every rank reports
optimizer-step spans and timings, the learning rate, DataLoader wait, its collectives
(here the loss averaging) and the checkpoint, one rankscope step per optimizer step,
reduced across ranks at the sink. Without it, the script runs exactly as before.
"""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

STEPS = int(os.environ.get("DDP_STEPS", "5"))


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64 * STEPS, 32), torch.randn(64 * STEPS, 1))
    loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data, world, rank))
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    for step, (x, y) in enumerate(loader):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        average = loss.detach().clone()
        dist.all_reduce(average)  # the usual loss averaging for the log line
        if rank == 0:
            print(f"step {step}: loss {average.item() / world:.4f}", flush=True)
    if rank == 0:
        torch.save(model.module.state_dict(), os.environ.get("DDP_CHECKPOINT", "/tmp/ddp_plain.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
