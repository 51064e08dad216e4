"""Process identity inside a Monarch actor (its rank and mesh coordinates) and across torchrun's nodes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rankscope.core import names as attr

from ..conftest import ROOT, free_port, run_python
from ..pipeline import clean_env

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


@pytest.mark.timeout(180)
def test_a_restart_on_one_node_is_a_new_attempt_on_every_node(tmp_path: Path) -> None:
    """Two torchrun agents on one host, one node each. Node 1's rank fails; node 0's is healthy and
    its agent restarts it for the new round without counting a restart (torchelastic counts per
    node). Both ranks of the new world still say attempt 1: the attempt is the rendezvous round."""
    endpoint = f"127.0.0.1:{free_port()}"
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1"]
    command += ["--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", "--rdzv-id=two-nodes", "--max-restarts=1"]
    command += ["--monitor-interval=0.5", str(ROOT / "tests" / "workers" / "rendezvous_worker.py"), str(tmp_path)]
    env = clean_env(FAIL_NODE="1", RANKSCOPE_EXPERIMENT="two-nodes")
    logs = [tmp_path / f"node{i}.log" for i in range(2)]
    with logs[0].open("w") as out0, logs[1].open("w") as out1:
        nodes = [
            subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            for out in (out0, out1)
        ]
        try:
            deadline = time.monotonic() + 150
            while time.monotonic() < deadline and len(list(tmp_path.glob("a*-n*.json"))) < 4:
                time.sleep(0.2)
        finally:
            for node in nodes:  # the agent and its rank: the healthy one still sleeps
                os.killpg(node.pid, signal.SIGKILL)
                node.wait(timeout=30)
    errors = [log.read_text(errors="replace")[-2000:] for log in logs]
    found = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("a*-n*.json"))]
    assert len(found) == 4, (found, errors)
    first, second = [r for r in found if r["attempt"] == 0], [r for r in found if r["attempt"] != 0]
    assert sorted(r["node"] for r in first) == [0, 1] and all(r["restarts"] == 0 for r in first), found
    assert sorted(r["node"] for r in second) == [0, 1] and {r["attempt"] for r in second} == {1}, found
    assert sorted(r["restarts"] for r in second) == [0, 1], found  # torchelastic's own counts differ
