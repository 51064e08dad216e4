"""Process identity inside a Monarch actor: its rank and mesh coordinates."""

from __future__ import annotations

import json

from rankscope.core import names as attr

from ..conftest import run_python

MONARCH_CODE = """
import asyncio, json
import rankscope as rs
from monarch.actor import Actor, endpoint, this_host

class Who(Actor):
    @endpoint
    async def resource(self) -> dict:
        return dict(rs.get_resource().attributes)

async def main():
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    who = procs.spawn("who", Who)
    found = await who.resource.call()
    print("RESULT " + json.dumps([a for _, a in found.items()]))
    await procs.stop()

asyncio.run(main())
"""


def test_monarch_actor_rank_and_mesh() -> None:
    result = run_python(MONARCH_CODE, {"RANKSCOPE_EXPERIMENT": "exp-monarch"}, timeout=180)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, result.stdout + result.stderr
    found = sorted(json.loads(lines[0][7:]), key=lambda a: a[attr.RANK])
    assert [
        (a[attr.RANK], a[attr.WORLD_SIZE], a["rankscope.mesh.gpus.rank"], a["rankscope.mesh.gpus.size"]) for a in found
    ] == [("0", "2", "0", "2"), ("1", "2", "1", "2")]
    assert {a[attr.EXPERIMENT_ID] for a in found} == {"exp-monarch"}
