"""Forge's first example (seeds: "Call record_metric from Anywhere"), imports changed only.

    python examples/forge_single.py

prints the global view: my_sum_metric 6.0, my_max_metric 3.0, my_mean_metric 2.0.
"""

import asyncio

from rankscope.forge import Reduce, get_or_create_metric_logger, record_metric


async def main():
    # Setup logger
    mlogger = await get_or_create_metric_logger(process_name="Controller")
    await mlogger.init_backends.call_one({"console": {"logging_mode": "global_reduce"}})

    # Have this in any process
    def my_fn(number):
        record_metric("my_sum_metric", number, Reduce.SUM)  # sum(1,2,3)
        record_metric("my_max_metric", number, Reduce.MAX)  # max(1,2,3)
        record_metric("my_mean_metric", number, Reduce.MEAN)  # mean(1,2,3)

    # Accumulate metrics
    for number in range(1, 4):  # 1, 2, 3
        my_fn(number)

    # Flush
    await mlogger.flush.call_one(global_step=0)

    # Shutdown when done
    await mlogger.shutdown.call_one()


if __name__ == "__main__":
    asyncio.run(main())
