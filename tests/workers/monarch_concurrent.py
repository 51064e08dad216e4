"""Two concurrent endpoint calls in one actor that carry different contexts (CPU).

The controller asks the first call for server spans and not the second; the actor runs both
as ``@concurrent_endpoint`` tasks, and the first reads its context only after the second has
entered its own. Each prints what a call it made would carry.
"""

import asyncio
import json
import sys

from monarch.actor import Actor, concurrent_endpoint, this_host

import rankscope as rs
from rankscope.integrations.monarch import propagation


def _asks_server_spans() -> bool | None:
    carried = propagation._carry()  # what a call made from here would carry
    return None if carried is None else carried.server


class Probe(Actor):
    def __init__(self) -> None:
        self.second_entered = asyncio.Event()

    @concurrent_endpoint
    async def first(self) -> bool | None:
        await asyncio.wait_for(self.second_entered.wait(), 60)  # the second call is in its context now
        return _asks_server_spans()

    @concurrent_endpoint
    async def second(self) -> bool | None:
        self.second_entered.set()
        await asyncio.sleep(0)  # let the first call read while this one is still running
        return _asks_server_spans()


async def main(endpoint_url: str) -> None:
    rs.init(experiment="monarch-concurrent", role="controller", endpoint=endpoint_url)
    procs = this_host().spawn_procs(per_host={"procs": 1})
    probe = procs.spawn("probe", Probe)
    propagation.server_spans = True  # the first call asks for server spans...
    first = probe.first.call_one()
    propagation.server_spans = False  # ...the second does not
    second = probe.second.call_one()
    print(json.dumps({"first": await first, "second": await second}))
    rs.shutdown()
    await procs.stop()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
