"""Process identity in real processes: a torch.distributed group and DeviceMesh, and inheritance
by children (the experiment and the run) while a new launch is a new run."""

from __future__ import annotations

import json

from rankscope.core import names as attr

from ..conftest import run_python

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


def test_device_mesh_dimensions_and_initialized_process_group() -> None:
    from ..conftest import free_port

    result = run_python(MESH_CODE.format(port=free_port()))
    assert result.returncode == 0, result.stderr
    a = json.loads(result.stdout.strip().splitlines()[-1])
    assert a["rankscope.mesh.dp.rank"] == "0" and a["rankscope.mesh.dp.size"] == "1"
    assert a["rankscope.mesh.tp.rank"] == "0" and a["rankscope.mesh.tp.size"] == "1"
    assert a[attr.WORLD_SIZE] == "1" and a[attr.RANK] == "0"


def test_child_process_inherits_the_experiment_and_the_run_and_a_new_launch_is_a_new_run() -> None:
    code = (
        "import json, subprocess, sys, rankscope as rs\n"
        "parent = rs.init().attributes\n"
        "child = subprocess.run([sys.executable, '-m', 'rankscope.cli', 'identity'], capture_output=True, text=True)\n"
        "print(json.dumps([dict(parent), json.loads(child.stdout)]))\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    parent, child = json.loads(result.stdout.strip().splitlines()[-1])
    assert parent[attr.EXPERIMENT_ID] == child[attr.EXPERIMENT_ID]
    assert parent[attr.RUN_ID] == child[attr.RUN_ID]  # one launch: the child is part of the parent's run
    launches = [run_python(code, {"RANKSCOPE_EXPERIMENT": "same"}) for _ in range(2)]
    runs = {json.loads(r.stdout.strip().splitlines()[-1])[0][attr.RUN_ID] for r in launches}
    assert len(runs) == 2, runs  # the same name launched twice: two runs
    assert parent[attr.SERVICE_INSTANCE_ID] != child[attr.SERVICE_INSTANCE_ID]
    assert parent[attr.PROCESS_PID] != child[attr.PROCESS_PID]
