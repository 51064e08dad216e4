"""The instrumentors under the real ``opentelemetry-instrument``: each one enabled records its
metrics, and ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS`` turns off exactly the ones it names."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rankscope.instrumentation import INSTRUMENTORS

from ..conftest import ROOT

BIN = Path(sys.executable).parent


WORKLOAD = """
import json, os, sys, tempfile
import torch, torch.distributed as dist
import torch.distributed.elastic.metrics as elastic
from rankscope.core import runtime as slot
from rankscope.integrations.monarch import propagation
from rankscope.instrumentation import INSTRUMENTORS

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 4), torch.randn(4, 1)))
import monarch._src.actor.actor_mesh  # what a Monarch program imports
for x, y in loader:
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
    dist.all_reduce(torch.ones(2))
torch.save(model.state_dict(), os.path.join(tempfile.mkdtemp(), "m.pt"))
elastic.put_metric("count", 1, "app")
keys = set(slot.recorder.accs) if slot.recorder else set()
print(json.dumps({
    "instrumented": sorted(n for n, c in INSTRUMENTORS.items() if c()._is_instrumented_by_opentelemetry),
    "server_spans": propagation.server_spans,
    "keys": sorted(keys),
}))
"""

PREFIX = {
    "torch_optimizer": "optimizer/",
    "torch_dataloader": "dataloader/",
    "torch_distributed": "comm/",
    "torch_checkpoint": "checkpoint/",
    "torchelastic": "torchelastic/",
}


def _instrumented_run(disabled: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "OTEL_"))}
    env.update(
        OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=disabled,
        RANK="0",  # a torchrun worker, so the torchelastic bridge configures itself
        WORLD_SIZE="1",
        RANKSCOPE_AUTO_STEP="false",  # keep every value in the collector to read back
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
    )
    command = [str(BIN / "opentelemetry-instrument"), sys.executable, "-c", WORKLOAD]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180, cwd=ROOT, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith('{"instrumented"')]
    return json.loads(line)


@pytest.mark.parametrize("disabled", [*INSTRUMENTORS, "torch_memory,monarch"])
def test_opentelemetry_instrument_honours_disabled_instrumentations(disabled: str) -> None:
    found = _instrumented_run(disabled)
    off = set(disabled.split(","))
    assert found["instrumented"] == sorted(set(INSTRUMENTORS) - off)
    for name, prefix in PREFIX.items():
        emitted = any(k.startswith(prefix) for k in found["keys"])
        assert emitted == (name not in off), (name, found["keys"])
    assert found["server_spans"] is (None if "monarch" in off else True)
