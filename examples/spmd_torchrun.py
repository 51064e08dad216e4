"""SPMD ranks under torchrun: the exact cross-rank view per step, plus one line per rank.

    torchrun --standalone --nproc_per_node=4 examples/spmd_torchrun.py

Zero setup: each rank's Resource (rank, world size, experiment from the script's name) is
detected, the first rank starts the experiment's embedded sink, the others find it, and the
sink prints the global view (the loss averaged over the ranks, the tokens summed) and each
rank's own as each step completes. The ranks train one linear model data-parallel: each its
own fixed batch, gradients averaged with an all-reduce, so the loss goes down on every rank.
"""

import torch
import torch.distributed as dist

import rankscope as rs

STEPS = 5


def main() -> None:
    dist.init_process_group("gloo")
    per_rank = {"backend": "console", "logging_mode": "per_rank_reduce"}  # each rank's own line too
    rs.init(backends={"console": {"logging_mode": "global_reduce"}, "per_rank": per_rank})
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same model on every rank, and the same target
    model = torch.nn.Linear(8, 1)
    target = torch.randn(8, 1)
    torch.manual_seed(1 + rank)  # each rank its own batch
    x = torch.randn(16, 8)
    y = x @ target + 0.01 * torch.randn(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        loss = (model(x) - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():  # what DistributedDataParallel does: the ranks' mean gradient
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        rs.record_metric("loss", loss.detach())  # a tensor: read at flush, no sync here
        rs.record_metric("tokens", 16, rs.Reduce.SUM)
        rs.flush(step)
    rs.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
