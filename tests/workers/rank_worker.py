"""One SPMD rank under torchrun: gloo process group, a few metrics, flush, shutdown."""

import torch
import torch.distributed as dist

import rankscope as rs


def values_of(rank: int) -> list[float]:
    """Deterministic per-rank values with different counts per rank (so MEAN must be weighted)."""
    return [rank * 1.5 + i * 0.25 for i in range(rank + 2)]


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for step in range(2):
        rs.record_metric("rank_value", rank, rs.Reduce.SUM)
        for v in values_of(rank):
            rs.record_metric("loss", v + step, rs.Reduce.MEAN)
            rs.record_metric("loss_std", v + step, rs.Reduce.STD)
        rs.record_metric("grad_norm", torch.tensor(float(rank)), rs.Reduce.MAX)
        rs.flush(step)
    dist.barrier()
    rs.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
