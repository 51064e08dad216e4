"""Forge's logging-modes example on plain Monarch actors (CPU), imports changed only.

    python examples/forge_actors.py [global_reduce|per_rank_reduce|per_rank_no_reduce]

Two process meshes of two procs each; every proc records its rank with Reduce.SUM, twice;
the controller flushes step 0. global_reduce prints 4.0; per_rank_reduce prints one block
per process (0.0, 2.0, 0.0, 2.0, labelled MyActor_<mesh>_r<rank>); per_rank_no_reduce
streams the 8 raw values. The actors' values land in step 0 exactly: the controller's
flush closes the step in every actor process it created.
"""

import asyncio
import sys

from monarch.actor import Actor, current_rank, endpoint, this_host

from rankscope.forge import Reduce, get_or_create_metric_logger, record_metric


# Your distributed actor
class MyActor(Actor):
    @endpoint
    async def my_fn(self):
        rank = current_rank().rank  # 0 or 1 per replica
        record_metric("my_sum_rank_metric", rank, Reduce.SUM)  # <--- your metric


async def main(mode: str) -> None:
    # Setup logger
    mlogger = await get_or_create_metric_logger(process_name="Controller")
    await mlogger.init_backends.call_one({"console": {"logging_mode": mode}})  # <--- Define logging_mode here

    # Setup actor: 2 replicas of 2 procs each
    replicas = [this_host().spawn_procs(per_host={"procs": 2}) for _ in range(2)]
    actors = [procs.spawn("my_actor", MyActor) for procs in replicas]

    # Accumulate metrics
    for _ in range(2):  # 2 steps
        await asyncio.gather(*(actor.my_fn.call() for actor in actors))

    # Flush
    await mlogger.flush.call_one(global_step=0)  # Flush and reset
    await mlogger.shutdown.call_one()
    for procs in replicas:
        await procs.stop()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "global_reduce"))
