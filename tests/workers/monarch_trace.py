"""A Monarch controller calling traced actors (CPU): the callee's spans are children of the caller's."""

import asyncio
import sys

from monarch.actor import Actor, endpoint, this_host

import rankscope as rs


class Generator(Actor):
    @endpoint
    async def generate(self, prompt: str) -> str:
        with rs.trace("generate") as t:
            await asyncio.sleep(0.01)
            t.step("decode")
        return prompt.upper()

    @endpoint
    async def ping(self) -> int:  # no arguments at all: the context still travels
        rs.record_event("pinged")
        return 1


async def main(endpoint_url: str) -> None:
    rs.init(experiment="monarch-trace", role="controller", endpoint=endpoint_url)
    procs = this_host().spawn_procs(per_host={"procs": 2})
    generators = procs.spawn("generator", Generator)
    for step in range(2):
        with rs.trace("rollout"):
            replies = await generators.generate.call("hi")
            assert [r for _, r in replies.items()] == ["HI", "HI"]
            await generators.slice(procs=0).ping.call_one()
        rs.flush(step)
    rs.shutdown()
    await procs.stop()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
