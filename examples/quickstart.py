"""A training-loop shaped quickstart: record from anywhere, flush per step, see the reduction.

    python examples/quickstart.py

Runs in one process with no sink: the console backend prints this process's per-step view
(for one process the global view equals the local reduction), here in its ``full`` format,
every key each reduce type yields (leave ``backends`` out for the default: one compact line
per step). Set RANKSCOPE_ENDPOINT to a sink or Collector to also export every step over OTLP.
"""

import math
import random

import rankscope as rs


def compute_reward(sample: float) -> float:
    reward = math.tanh(sample)
    rs.record_metric("reward/mean", reward)  # no logger object passed around
    rs.record_metric("reward/max", reward, rs.Reduce.MAX)
    return reward


def main() -> None:
    every_key = {"console": {"logging_mode": "global_reduce", "format": "full"}}
    rs.init(experiment="quickstart", role="trainer", backends=every_key)
    rng = random.Random(0)
    for step in range(3):
        for _ in range(64):
            compute_reward(rng.gauss(0.1 * step, 1.0))
            rs.record_metric("latency_s", rng.lognormvariate(-4, 0.5), rs.Reduce.DISTRIBUTION)
        rs.record_metric("loss", 2.0 / (step + 1), rs.Reduce.LAST)
        rs.record_metric("samples", 64, rs.Reduce.SUM)
        rs.flush(step)
    rs.shutdown()


if __name__ == "__main__":
    main()
