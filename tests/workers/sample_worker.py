"""A torchrun rank that records sample rows each step (``tests/test_samples_torchrun.py``).

``ranked STEPS``: 5 rows a step with distinct rewards (``100*step + 10*rank + i``), kept by
``rank_by="reward", k=2``, inside a traced phase, under policy version ``step``.
``reservoir STEPS``: rank r records ``5 * (r + 1)`` rows a step without ``rank_by`` (k=4).
"""

from __future__ import annotations

import sys

import torch.distributed as dist

import rankscope as rs


def main(mode: str, steps: int) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    rs.init(role="trainer")
    for step in range(steps):
        rs.rl.set_policy_version(step)
        with rs.trace("rollout"):
            if mode == "ranked":
                for i in range(5):
                    reward = 100.0 * step + 10.0 * rank + i
                    row = {"reward": reward, "text": f"r{rank} s{step} i{i}"}
                    rs.record_sample("rollouts", row, rank_by="reward", k=2)
            else:
                for i in range(5 * (rank + 1)):
                    rs.record_sample("picks", {"who": rank, "i": i}, k=4)
        rs.record_metric("loss", 1.0)
        rs.flush(step)
    dist.barrier()
    rs.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
