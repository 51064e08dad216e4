"""The main example: an RL-shaped job of several processes becomes one experiment.

    python examples/main.py [--steps 8] [--slow-rank 2] [--slow-from 3]

Re-runs itself under torchrun: 4 trainer ranks (gloo, CPU) train a tiny policy with an
all-reduce per step, and rank 0 starts a generator process beside them (as an RL job's rollout
server would be) that sends rollouts to the trainers through a queue. Nothing is configured:
the first process starts the experiment's embedded sink, every process finds it, and it prints
one global view per step across both roles. From step ``--slow-from`` on, trainer rank
``--slow-rank`` is slow in its forward pass: the sink names it a straggler (and asks it for a
profile of its next steps). The sink keeps the run: at the end, the process that started it says
where the run's report is, one self-contained HTML page (metrics with their cross-rank spread,
the rank x phase heat map, the step Gantt with lineage arrows from generator to trainer,
anomalies, samples).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import sys
import time

import torch
import torch.distributed as dist

import rankscope as rs

VIEWS = {"console": {"logging_mode": "global_reduce"}}  # the sink adds the report and JSONL: every run is kept
TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME")


def generator(experiment: str, steps: int, rollouts: mp.Queue) -> None:
    """A rollout server: its own process and role in the same experiment."""
    for name in [*TORCHRUN_VARIABLES, *(k for k in os.environ if k.startswith("TORCHELASTIC_"))]:
        os.environ.pop(name, None)  # not a torchrun rank: a process of its own
    os.environ["RANKSCOPE_SINK"] = "embedded"  # one process of its role: still the experiment's sink
    rs.init(experiment=experiment, role="generator", backends=VIEWS)
    rng = random.Random(7)
    for step in range(steps):
        batch = []
        with rs.trace("generate") as t:
            time.sleep(0.02)  # sampling
            t.step("sample")
            for i in range(8):
                reward = rng.gauss(0.1 * step, 1.0)
                length = rng.randint(16, 256)
                rs.record_metric("generator/reward", reward)
                rs.record_metric("generator/response_tokens", length, rs.Reduce.DISTRIBUTION)
                rs.record_sample(
                    "rollouts", {"prompt": f"q{step}-{i}", "reward": reward, "tokens": length}, rank_by="reward", k=2
                )
                batch.append((reward, rs.rl.lineage(tokens=length)))
            t.step("score")
        rollouts.put(batch)
        rs.flush(step)
    rs.shutdown()


def train(args: argparse.Namespace) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    rs.init(role="trainer", backends=VIEWS)
    experiment = str(rs.get_resource().attributes["rankscope.experiment.id"])  # type: ignore[union-attr]
    rollouts: mp.Queue | None = None
    server = None
    if rank == 0:
        context = mp.get_context("spawn")
        rollouts = context.Queue(maxsize=2)
        server = context.Process(target=generator, args=(experiment, args.steps, rollouts))
        server.start()
    torch.manual_seed(rank)
    policy = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.01)
    for step in range(args.steps):
        with rs.trace("train") as t:
            rewards = torch.zeros(8)
            if rollouts is not None:
                batch = rollouts.get(timeout=120)
                rs.rl.consume([lineage for _, lineage in batch])  # arrows: generation -> this step
                rewards = torch.tensor([reward for reward, _ in batch])
            dist.broadcast(rewards, src=0)
            t.step("data")
            x = torch.randn(256, 64)
            loss = (policy(x).squeeze(-1).mean() - rewards.mean()).pow(2)
            if rank == args.slow_rank and step >= args.slow_from:
                time.sleep(0.15)  # the straggler
            t.step("forward")
            optimizer.zero_grad()
            loss.backward()
            for p in policy.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
            t.step("backward")
            optimizer.step()
        rs.record_metric("trainer/loss", loss.detach())
        rs.record_metric(
            "trainer/grad_norm", torch.nn.utils.get_total_norm([p.grad for p in policy.parameters()]), rs.Reduce.MAX
        )
        rs.record_metric("trainer/samples", 256, rs.Reduce.SUM)
        rs.flush(step)
    if rank != 0:
        rs.shutdown()  # returns once the sink wrote this rank's last step
    dist.barrier()
    if rank == 0:
        assert server is not None
        server.join(timeout=120)
        rs.shutdown()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--slow-rank", type=int, default=2)
    parser.add_argument("--slow-from", type=int, default=3)
    args = parser.parse_args()
    if "LOCAL_RANK" not in os.environ:  # plain `python examples/main.py`: become 4 torchrun ranks
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4"]
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        os.execv(sys.executable, [*torchrun, os.path.abspath(__file__), *sys.argv[1:]])
    train(args)


if __name__ == "__main__":
    main()
