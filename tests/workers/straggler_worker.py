"""A torchrun rank for the straggler tests (``tests/e2e/test_stragglers.py``): a small DDP-style step.

Each step is ``rs.trace("train")`` with four phases: ``data`` (loading a batch), ``forward``,
``backward`` and ``optimizer`` (after the step's last collective); then ``loss`` is recorded and
the step flushed. How the gradients are averaged (``--mode``):

- ``python``: a real ``dist.all_reduce`` of the gradients at the end of backward, through the
  Python API (the collective wrappers ``rs.init`` installs, ``tracing.collectives``, see it);
- ``ddp``: ``DistributedDataParallel`` with small buckets (several bucket all-reduces in flight
  during backward, from DDP's reducer);
- ``fsdp``: FSDP2's ``fully_shard`` on each layer and the model (all-gathers in forward and
  backward, reduce-scatters in backward).

``RANKSCOPE_COLLECTIVES=0`` hides every collective from rankscope (as NCCL from C++ would be).
Each phase takes ``--base`` seconds
(a sleep: a 2-core box running 4 ranks stays idle enough to keep time), plus the extra seconds
of every ``--slow`` that names this rank, phase and step.

    straggler_worker.py --steps 22 --slow 2:forward:5-14:0.3 --slow 0:forward:15-21:0.3

``--slow RANK:PHASE:FIRST-LAST:SECONDS`` (repeatable; the steps inclusive).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

import rankscope as rs

PHASES = ("data", "forward", "backward", "optimizer")


@dataclass(frozen=True)
class Slow:
    rank: int
    phase: str
    first: int
    last: int
    seconds: float

    @classmethod
    def parse(cls, text: str) -> Slow:
        rank, phase, steps, seconds = text.split(":")
        first, last = steps.split("-")
        if phase not in PHASES:
            raise argparse.ArgumentTypeError(f"phase {phase!r} is not one of {PHASES}")
        return cls(int(rank), phase, int(first), int(last), float(seconds))


def extra(slow: list[Slow], rank: int, phase: str, step: int) -> float:
    return sum(s.seconds for s in slow if s.rank == rank and s.phase == phase and s.first <= step <= s.last)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--base", type=float, default=0.003, help="seconds each phase takes on every rank")
    parser.add_argument("--slow", type=Slow.parse, action="append", default=[])
    parser.add_argument("--mode", choices=("python", "ddp", "fsdp"), default="python")
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    rs.init(role="trainer")
    torch.manual_seed(0)
    model: torch.nn.Module = torch.nn.Linear(16, 4)
    if args.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        layers = [torch.nn.Linear(64, 64) for _ in range(4)] + [torch.nn.Linear(64, 4)]
        model = DistributedDataParallel(torch.nn.Sequential(*layers), bucket_cap_mb=0.01)  # ~5 buckets
    elif args.mode == "fsdp":
        from torch.distributed.fsdp import fully_shard

        layers = [torch.nn.Linear(16, 16) for _ in range(2)] + [torch.nn.Linear(16, 4)]
        model = torch.nn.Sequential(*layers)
        for layer in layers:
            fully_shard(layer)
        fully_shard(model)
    width = 64 if args.mode == "ddp" else 16
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def phase(name: str, step: int) -> None:
        time.sleep(args.base + extra(args.slow, rank, name, step))

    for step in range(args.steps):
        with rs.trace("train") as t:
            phase("data", step)
            batch, target = torch.randn(8, width), torch.randn(8, 4)
            t.step("data")
            phase("forward", step)
            loss = torch.nn.functional.mse_loss(model(batch), target)
            t.step("forward")
            phase("backward", step)
            optimizer.zero_grad()
            loss.backward()  # DDP and FSDP2 average the gradients in here
            if args.mode == "python":
                grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
                dist.all_reduce(grads)  # the gradients averaged, as DDP's reducer would
                grads /= world
                offset = 0
                for p in model.parameters():
                    if p.grad is not None:
                        p.grad.copy_(grads[offset : offset + p.numel()].view_as(p))
                        offset += p.numel()
            t.step("backward")
            phase("optimizer", step)
            optimizer.step()
            t.step("optimizer")
        rs.record_metric("loss", loss.item())
        rs.flush(step)
    rs.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
