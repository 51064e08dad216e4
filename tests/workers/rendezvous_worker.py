"""A rank of a two-node torchrun job on one host (``tests/e2e/test_identity.py``): it writes the
attempt its rankscope Resource carries (as ``rs.init`` builds it), with torchelastic's restart
count, to ``DIR/a{attempt}-n{node}.json``; node ``FAIL_NODE``'s rank then exits 3 in the first round
(the other node's rank waits, healthy, until its agent restarts it for the new round)."""

import json
import os
import sys
import time
from pathlib import Path

import torch.distributed  # noqa: F401 - loaded, as in a training script: rankscope reads the rendezvous then

from rankscope.core import names as attr
from rankscope.core.identity import build_resource

directory, restarts = Path(sys.argv[1]), os.environ["TORCHELASTIC_RESTART_COUNT"]
attempt, node = build_resource().attributes[attr.EXPERIMENT_ATTEMPT], os.environ["GROUP_RANK"]
found = {"attempt": attempt, "restarts": int(restarts), "node": int(node)}
(directory / f"a{attempt}-n{node}.json").write_text(json.dumps(found))
if os.environ["GROUP_RANK"] == os.environ["FAIL_NODE"] and restarts == "0":
    sys.exit(3)
time.sleep(60)  # healthy until its agent restarts it, or the test's job ends
