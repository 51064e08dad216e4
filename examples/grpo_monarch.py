"""A toy GRPO loop on plain Monarch actors (CPU, well under a minute).

    opentelemetry-instrument python examples/grpo_monarch.py [--steps 6] [--sync-every 3]

A trainer (a tiny torch policy), two generator replicas, a replay buffer and this
controller. The policy learns to emit token 3. Telemetry comes from the distro's
instrumentors (optimizer, collectives, checkpoint, Monarch endpoints: server spans and
per-endpoint metrics) plus a few one-line ``rs.rl`` / ``record_metric`` calls. All roles
land in one experiment view (W&B with ``RANKSCOPE_BACKENDS='{"wandb": {...}}'``, else
the console) and every step is one trace: controller → generator → trainer.

Weights reach the generators every ``--sync-every`` steps, so ``generator/policy_staleness``
climbs between syncs and drops to 0 after each one.

Samples and lineage: each generator offers every rollout to the ``rollouts`` sample table
(``rs.record_sample``, ranked by reward), so the run's table holds the best and worst two
rollouts of each step across both replicas, each row naming its generator, policy version
and trace. Each rollout carries the ``Lineage`` of the generation that made it through the
replay buffer, and the trainer's ``rs.rl.consume(batch)`` links its ``Trainer.train_step``
span to those ``Generator.generate`` spans (Jaeger shows the links, Perfetto draws arrows).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time

import torch
import torch.distributed as dist
from monarch.actor import Actor, current_rank, endpoint, this_host

import rankscope as rs

VOCAB, LENGTH, GROUP, TARGET = 8, 6, 4, 3


class Policy(torch.nn.Module):
    """Next-token logits from the previous token: small enough to train in milliseconds."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 16)
        self.head = torch.nn.Linear(16, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens))


def log_probs(policy: Policy, sequences: torch.Tensor) -> torch.Tensor:
    """Sum of log p(token_t | token_{t-1}) per sequence (the first token is the prompt)."""
    logits = policy(sequences[:, :-1])
    chosen = torch.log_softmax(logits, -1).gather(-1, sequences[:, 1:, None])[..., 0]
    return chosen.sum(-1)


class Trainer(Actor):
    def __init__(self) -> None:
        torch.manual_seed(0)
        self.policy = Policy()
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=0.05)
        self.version = 0
        # The trainer's data-parallel group (one rank here): the loss is averaged over it.
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)

    @endpoint
    async def train_step(self, batch: list[dict]) -> int:
        rs.rl.consume(batch)  # this span links to the generations of its batch; token-weighted staleness
        sequences = torch.tensor([s["tokens"] for s in batch])
        advantages = torch.tensor([s["advantage"] for s in batch])
        loss = -(advantages * log_probs(self.policy, sequences)).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        dist.all_reduce(loss.detach())
        self.version += 1
        rs.rl.set_policy_version(self.version)
        rs.record_metric("trainer/loss", loss.detach())
        rs.throughput.record_tokens(sequences.numel())
        return self.version

    @endpoint
    async def get_weights(self) -> tuple[int, dict]:
        with rs.rl.weight_sync("push", version=self.version):
            return self.version, {k: v.clone() for k, v in self.policy.state_dict().items()}

    @endpoint
    async def save(self, path: str) -> None:
        torch.save(self.policy.state_dict(), path)


class Generator(Actor):
    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.policy = Policy()
        self.version = -1
        torch.manual_seed(100 + current_rank().rank)

    @endpoint
    async def sync_weights(self) -> int:
        with rs.rl.weight_sync("pull") as sync:
            version, state = await self.trainer.get_weights.call_one()
            self.policy.load_state_dict(state)
            self.version = sync.version = version
        return version

    @endpoint
    async def generate(self, prompts: list[int]) -> list[dict]:
        samples = []
        for waiting, prompt in enumerate(reversed(prompts)):
            start = time.perf_counter()
            tokens = torch.full((GROUP, 1), prompt)
            with torch.no_grad():
                for _ in range(LENGTH):
                    probs = torch.softmax(self.policy(tokens[:, -1]), -1)
                    tokens = torch.cat([tokens, torch.multinomial(probs, 1)], 1)
            rewards = (tokens[:, 1:] == TARGET).float().mean(-1)
            advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-6)  # GRPO: relative to the group
            lineage = rs.rl.generation(  # this generation's span, policy version and tokens
                tokens=GROUP * LENGTH,
                latency_s=time.perf_counter() - start,
                sequence_lengths=[LENGTH] * GROUP,
                queue_depth=waiting,
            )
            for t, r, a in zip(tokens.tolist(), rewards.tolist(), advantages.tolist(), strict=True):
                samples.append({"tokens": t, "reward": r, "advantage": a, "lineage": lineage})
                completion = " ".join(map(str, t[1:]))
                row = {"prompt": prompt, "completion": completion, "reward": r, "advantage": a}
                rs.record_sample("rollouts", row, rank_by="reward", k=2)  # best and worst 2, both replicas
            rs.record_metric("reward/mean", rewards.mean())
        return samples


class ReplayBuffer(Actor):
    def __init__(self, capacity: int = 48) -> None:
        self.capacity = capacity
        self.samples: list[dict] = []

    @endpoint
    async def add(self, samples: list[dict]) -> None:
        self.samples += samples
        evicted = max(0, len(self.samples) - self.capacity)
        del self.samples[:evicted]
        rs.rl.replay_buffer(size=len(self.samples), writes=len(samples), evictions=evicted)

    @endpoint
    async def sample(self, n: int) -> list[dict]:
        start = time.perf_counter()
        batch = self.samples[-n:]
        rs.rl.replay_buffer(size=len(self.samples), reads=len(batch), read_latency_s=time.perf_counter() - start)
        return batch


async def main(steps: int, sync_every: int) -> None:
    rs.init(role="controller")
    trainer_procs = this_host().spawn_procs(per_host={"procs": 1})
    generator_procs = this_host().spawn_procs(per_host={"procs": 2})
    buffer_procs = this_host().spawn_procs(per_host={"procs": 1})
    trainer = trainer_procs.spawn("trainer", Trainer)
    generators = generator_procs.spawn("generator", Generator, trainer)
    buffer = buffer_procs.spawn("replay_buffer", ReplayBuffer)

    rs.rl.set_policy_version(0)
    await generators.sync_weights.call()
    for step in range(steps):
        with rs.trace("rl_step") as t:
            rollouts = await generators.generate.call([0, 1, 2])
            await buffer.add.call_one([s for _, batch in rollouts.items() for s in batch])
            t.step("rollout")
            batch = await buffer.sample.call_one(2 * 3 * GROUP)
            version = await trainer.train_step.call_one(batch)
            rs.rl.set_policy_version(version)
            t.step("train")
            if (step + 1) % sync_every == 0:
                await generators.sync_weights.call()
                t.step("weight_sync")
        print(f"step {step}: policy v{version}", flush=True)
        rs.flush(step)
    await trainer.save.call_one(os.path.join(tempfile.gettempdir(), f"grpo-{os.getpid()}.pt"))
    rs.flush(steps)  # the checkpoint's own step
    rs.shutdown()
    for procs in (trainer_procs, generator_procs, buffer_procs):
        await procs.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--sync-every", type=int, default=3, help="push weights to the generators every N steps")
    args = parser.parse_args()
    asyncio.run(main(args.steps, args.sync_every))
