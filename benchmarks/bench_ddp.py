"""What seeing DDP's bucket all-reduces costs a training step (``tracing.ddp``, issue 51).

A ``DistributedDataParallel`` model (``--layers`` linear layers of ``--width``, buckets of one
layer's gradients: the step's bucket all-reduces are counted and printed), one rank on gloo (the
hook's cost, not a network's), ``rs.init`` and a flush per step in every arm:

- ``unseen``: ``RANKSCOPE_COLLECTIVES=0``: DDP's built-in C++ all-reduce hook (the baseline);
- ``seen``: the default: DDP's ``allreduce_hook`` routed through the wrapped ``dist.all_reduce``,
  a ``comm/all_reduce`` span and four keys per bucket;
- ``python``: DDP's ``allreduce_hook`` registered by hand with the collectives off (what the
  Python hook alone costs, without rankscope's span and keys).

Each round runs every arm in a fresh child process, alternately; per arm the median step time of a
round, then the median and range of rounds; the ratio to ``unseen`` and the cost per bucket.

Run from the repository root:  python benchmarks/bench_ddp.py [--layers 8 --width 256 --steps 300 --rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

CHILD = """
import json, statistics, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
import rankscope as rs
from rankscope.core import runtime as slot

layers, width, steps, arm = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.set_num_threads(1)
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
rs.init(experiment="bench-ddp", backends={"console": {"format": "off"}})
cap = width * (width + 1) * 4 / 2**20  # one layer's gradients per bucket
layers_ = [torch.nn.Linear(width, width) for _ in range(layers)]
model = DistributedDataParallel(torch.nn.Sequential(*layers_), bucket_cap_mb=cap)
if arm == "python":
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    model.register_comm_hook(None, default_hooks.allreduce_hook)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
batch = torch.randn(16, width)
times = []
for step in range(steps):
    started = time.perf_counter()
    optimizer.zero_grad()
    model(batch).pow(2).mean().backward()
    optimizer.step()
    times.append(time.perf_counter() - started)
    calls = slot.recorder.accs.get("comm/all_reduce/calls")  # this step's bucket all-reduces (seen)
    last_calls = 0 if calls is None else calls.sum
    rs.flush(step)
rs.shutdown()
dist.destroy_process_group()
print(json.dumps({"step_s": statistics.median(times[steps // 5:]), "last_step_calls": last_calls}))
"""

ARMS = ("unseen", "seen", "python")


def run(arm: str, args: argparse.Namespace) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "OTEL_"))}
    if arm != "seen":
        env["RANKSCOPE_COLLECTIVES"] = "0"
    command = [sys.executable, "-c", CHILD, str(args.layers), str(args.width), str(args.steps), arm]
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    found: dict[str, list[float]] = {arm: [] for arm in ARMS}
    calls = 0.0
    for round_ in range(args.rounds):
        for arm in ARMS if round_ % 2 == 0 else reversed(ARMS):
            result = run(arm, args)
            found[arm].append(result["step_s"])
            if arm == "seen":
                calls = result["last_step_calls"]
        shown = ", ".join(f"{a} {found[a][-1] * 1e3:.3f} ms" for a in ARMS)
        print(f"round {round_ + 1}/{args.rounds}: {shown}", flush=True)
    base = statistics.median(found["unseen"])
    print(f"\n{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch DDP on gloo, 1 rank")
    print(f"{args.layers} layers of {args.width}: {calls:g} bucket all-reduces a step (seen)")
    for arm in ARMS:
        times = found[arm]
        median = statistics.median(times)
        print(
            f"{arm:>7}: {median * 1e3:8.3f} ms a step (range {min(times) * 1e3:.3f}-{max(times) * 1e3:.3f}), "
            f"{median / base:.3f}x unseen, {(median - base) / max(calls, 1) * 1e6:+7.1f} us a bucket"
        )


if __name__ == "__main__":
    main()
