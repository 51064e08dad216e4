"""Process identity inside a Monarch actor: its rank and mesh coordinates."""

from __future__ import annotations

import json

from rankscope.core import names as attr

from ..conftest import run_python

TORCHRUN = {
    "RANK": "5",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "8",
    "TORCHELASTIC_RUN_ID": "job-42",
    "TORCHELASTIC_RESTART_COUNT": "2",
}
















MESH_CODE = """
import json, os, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
import rankscope as rs
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
resource = rs.init(mesh=mesh)
print(json.dumps(dict(resource.attributes)))
rs.shutdown(); dist.destroy_process_group()
"""






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
