"""verl with ``rankscope`` among its tracking backends and its workers timed by role, on CPU.

    rankscope run -- python examples/verl_tracking.py [steps]

In a real verl job the settings that matter are on its command line:

    RANKSCOPE_EXPERIMENT=my-run python -m verl.trainer.main_ppo ... 'trainer.logger=[console,rankscope]' \\
        +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=rankscope.verl.register

verl's PPO trainer needs GPUs and a rollout engine, so on CPU this script plays verl's trainer with
verl's own parts: Ray started with that setup hook; a Ray actor in the place of verl's
``TaskRunner`` that builds worker groups with verl's single controller (``RayWorkerGroup`` over
CPU resource pools, roles colocated as verl colocates them: ``actor`` and ``ref`` in two processes,
``critic`` in one; ``examples/verl_cpu_workers.py``), calls them each step as verl's trainer does
(log-probs, reference log-probs, the critic's and the actor's updates), reduces
their metrics with verl's ``reduce_metrics``, logs them with ``Tracking(default_backend=["console",
"rankscope"])`` and finishes it. ``rankscope run`` starts the sink every process reports to and
prints each step's global view: the trainer's numbers beside the workers' phases, by role and rank.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import ray

STEPS, BATCH = 3, 8


@ray.remote
class TaskRunner:
    """Where verl builds its workers and its ``Tracking``: a Ray actor, not the process that started the job."""

    def run(self, steps: int) -> list[dict[str, Any]]:
        from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
        from verl.single_controller.ray.base import create_colocated_worker_cls
        from verl.utils.metric import reduce_metrics
        from verl.utils.tracking import Tracking

        from verl_cpu_workers import ActorWorker, CriticWorker, RefWorker

        def worker_groups(processes: int, roles: dict[str, type]) -> dict[str, Any]:
            """As verl's trainer builds them: the roles of a resource pool colocated in its processes."""
            pool = RayResourcePool(process_on_nodes=[processes], use_gpu=False, max_colocate_count=1)
            classes = {key: RayClassWithInitArgs(cls=ray.remote(cls)) for key, cls in roles.items()}
            colocated = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=create_colocated_worker_cls(classes))
            return colocated.spawn(prefix_set=classes.keys())

        groups = worker_groups(2, {"actor": ActorWorker, "ref": RefWorker})
        groups.update(worker_groups(1, {"critic": CriticWorker}))
        actor, ref, critic = groups["actor"], groups["ref"], groups["critic"]
        backends = ["console", "rankscope"]
        tracking = Tracking(project_name="examples", experiment_name="verl-cpu", default_backend=backends)
        tracking.log(data={"val-core/toy/reward/mean@4": 0.12}, step=0)  # validation before training
        logged: list[dict[str, Any]] = []
        for step in range(1, steps + 1):
            timing: dict[str, float] = {}
            start = time.perf_counter()
            actor.compute_log_prob(BATCH)
            timing["timing_s/old_log_prob"] = time.perf_counter() - start
            start = time.perf_counter()
            ref.compute_ref_log_prob(BATCH)
            timing["timing_s/ref"] = time.perf_counter() - start
            start = time.perf_counter()
            critic_outputs = critic.update_critic(BATCH)
            timing["timing_s/update_critic"] = time.perf_counter() - start
            start = time.perf_counter()
            outputs = actor.update_actor(BATCH) + critic_outputs
            timing["timing_s/update_actor"] = time.perf_counter() - start
            gathered: dict[str, list[float]] = {}
            for output in outputs:  # each worker's numbers, as verl's workers return them
                for key, value in output.items():
                    gathered.setdefault(key, []).append(value)
            metrics = reduce_metrics(gathered)
            metrics.update(timing)
            metrics["training/global_step"] = step
            tracking.log(data=metrics, step=step)
            logged.append({"step": step, **{k: float(v) for k, v in metrics.items()}})
        tracking.finish()  # as verl's TaskRunner does: the workers deliver what they hold
        import rankscope

        rankscope.shutdown()
        return logged


def main(steps: int = STEPS) -> list[dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if k.startswith(("RANKSCOPE_", "OTEL_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        runtime_env={"worker_process_setup_hook": "rankscope.verl.register", "env_vars": env},
    )
    try:
        logged: list[dict[str, Any]] = ray.get(TaskRunner.remote().run.remote(steps))
        return logged
    finally:
        ray.shutdown()


if __name__ == "__main__":
    for entry in main(int(sys.argv[1]) if len(sys.argv) > 1 else STEPS):
        print("logged", json.dumps(entry))
