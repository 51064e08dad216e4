"""A rank that cannot read its rendezvous round says so at once, and the sink names it (issue 50).

The attempt of a multi-node torchrun rank is its c10d rendezvous round (``core.torchrun``). Where
the rendezvous store is out of reach the attempt falls back to the node's restart count, which can
differ between nodes after a node is lost: the rank's data may then be refused as an earlier
attempt's. The rank warns on its console when it starts, carries why in its Resource
(``rankscope.experiment.attempt_fallback``), and the sink's refusal and status name it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from rankscope.core import names as attr
from rankscope.sink import BookConfig

from ..conftest import ROOT, free_port
from ..victim import step_request

CHILD = """
import json, rankscope as rs
print("RESOURCE " + json.dumps(dict(rs.get_resource().attributes)), flush=True)
"""


def test_a_rank_whose_rendezvous_store_is_out_of_reach_warns_at_once_and_carries_why(tmp_path: Path) -> None:
    """The rank's parent is a ``torchrun`` (a script of that name: its command line is what a rank
    reads) of a 2-node c10d rendezvous at a port nobody listens on."""
    launcher = tmp_path / "torchrun"
    launcher.write_text(f"#!/bin/sh\n\"{sys.executable}\" -c '{CHILD}'\n")
    launcher.chmod(0o755)
    endpoint = f"127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "OTEL_"))}
    env.update(TORCHELASTIC_RUN_ID="two-nodes", TORCHELASTIC_RESTART_COUNT="0", RANK="1", WORLD_SIZE="2")
    env.update(RANKSCOPE_EXPERIMENT="fallback", RANKSCOPE_BACKENDS='{"console": {"format": "off"}}')
    command = ["/bin/sh", str(launcher), "--nnodes=2", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", "x.py"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESOURCE ")]
    resource = json.loads(line[len("RESOURCE ") :])
    assert f"could not read the rendezvous round at {endpoint}" in resource[attr.ATTEMPT_FALLBACK]
    assert resource[attr.EXPERIMENT_ATTEMPT] == 0  # the node's restart count
    assert "could not read the rendezvous round" in done.stderr and "attempt_fallbacks" in done.stderr


def test_the_sink_names_a_fallen_back_rank_in_its_refusal_and_its_status(make_sink) -> None:
    """Rank 0 of attempt 1 (its rendezvous round read), rank 1 of attempt 0 (its round unread: its
    node's restart count): rank 1's data is refused as an earlier attempt's, and the refusal and
    the run's status say why."""
    sink = make_sink(http_port=None, book=BookConfig(grace=5))
    answers = []
    for rank, attempt, fallback in ((0, 1, None), (1, 0, "could not read the rendezvous round at h:1 (timeout)")):
        request = step_request("fallback", "r", rank, 0)
        resource = request.resource_metrics[0].resource
        resource.attributes.add(key=attr.EXPERIMENT_ATTEMPT).value.int_value = attempt
        if fallback is not None:
            resource.attributes.add(key=attr.ATTEMPT_FALLBACK).value.string_value = fallback
        answers.append(sink.export_metrics(request))
    assert answers[0].rejected == 0 and answers[1].rejected == 3
    assert "could not read the rendezvous round" in answers[1].message
    status = sink.status("fallback")
    assert status["superseded_points"] == 3
    assert status["attempt_fallbacks"] == {"count": 1, "processes": ["trainer_r1"]}
