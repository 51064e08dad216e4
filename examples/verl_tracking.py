"""verl's experiment tracking with ``rankscope`` among its backends, inside a Ray actor as in verl.

    python examples/verl_tracking.py [steps]

In a real verl job the two settings that matter are on its command line:

    python -m verl.trainer.main_ppo ... 'trainer.logger=[console,rankscope]' \\
        +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=rankscope.verl.register

verl's PPO trainer needs GPUs and a rollout engine, so on CPU this script stands in for verl's
``TaskRunner``: it starts Ray with the same setup hook, and a Ray actor builds verl's own
``Tracking(default_backend=["console", "rankscope"])`` and logs what verl's trainer logs at each
global step (validation at step 0, then the actor's, critic's and rollout's metrics and the
``timing_s/*`` phases, with made-up numbers). Its console view prints each step's global view (``RANKSCOPE_BACKENDS``).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any

import ray


def verl_metrics(step: int) -> dict[str, Any]:
    """The shape of what verl's ``RayPPOTrainer.fit`` logs at a global step (numbers made up)."""
    if step == 0:
        return {"val-core/gsm8k/reward/mean@4": 0.12, "val-aux/gsm8k/reward/std@4": 0.05}
    return {
        "actor/pg_loss": -0.01 * step,
        "actor/entropy": 1.5 / step,
        "actor/grad_norm": 0.3 + 0.01 * step,
        "actor/ppo_kl": 0.001 * step,
        "critic/score/mean": 0.1 * step,
        "critic/advantages/max": 2.0,
        "response_length/mean": 100.0 + step,
        "prompt_length/mean": 42,
        "timing_s/gen": 1.25 + 0.01 * step,
        "timing_s/ref": 0.31,
        "timing_s/old_log_prob": 0.27,
        "timing_s/update_actor": 0.9,
        "timing_s/step": 3.1,
        "perf/throughput": 1234.5 * math.sqrt(step),
        "training/global_step": step,
        "training/epoch": 0,
    }


@ray.remote
class TaskRunner:
    """Where verl builds its ``Tracking``: a Ray actor, not the process that started the job."""

    def run(self, steps: int, experiment_name: str) -> list[dict[str, Any]]:
        from verl.utils.tracking import Tracking

        backends = ["console", "rankscope"]
        tracking = Tracking(project_name="examples", experiment_name=experiment_name, default_backend=backends)
        logged = []
        for step in range(steps + 1):
            data = verl_metrics(step)
            tracking.log(data=data, step=step)
            logged.append({"step": step, **data})
        tracking.finish()
        import rankscope

        rankscope.shutdown()
        return logged


def main(steps: int = 3, experiment_name: str = "verl-example") -> list[dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if k.startswith(("RANKSCOPE_", "OTEL_"))}
    env.setdefault("RANKSCOPE_BACKENDS", '{"console": {"logging_mode": "global_reduce"}}')
    ray.init(
        num_cpus=1,
        include_dashboard=False,
        runtime_env={"worker_process_setup_hook": "rankscope.verl.register", "env_vars": env},
    )
    try:
        logged: list[dict[str, Any]] = ray.get(TaskRunner.remote().run.remote(steps, experiment_name))
        time.sleep(2.0)  # Ray forwards the actor's printout (the global view) a moment later
        return logged
    finally:
        ray.shutdown()


if __name__ == "__main__":
    for entry in main(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
        print("logged", json.dumps(entry))
