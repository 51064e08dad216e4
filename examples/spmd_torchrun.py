"""SPMD ranks under torchrun: the exact cross-rank view per step, plus one block per rank.

    torchrun --standalone --nproc_per_node=4 examples/spmd_torchrun.py

Zero setup: each rank's Resource (rank, world size, experiment from the torchrun run id) is
detected, the first rank starts the experiment's embedded sink, the others find it, and the
sink prints the global view and the per-rank views as each step completes.
"""

import torch
import torch.distributed as dist

import rankscope as rs


def main() -> None:
    dist.init_process_group("gloo")
    rs.init(backends={"console": {"logging_mode": "global_reduce"}, "per_rank": {"backend": "console"}})
    rank = dist.get_rank()
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        x = torch.randn(16, 8) + rank
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        rs.record_metric("loss", loss.detach())  # a tensor: read at flush, no sync here
        rs.record_metric("tokens", 16, rs.Reduce.SUM)
        rs.flush(step)
    rs.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
