"""The instrumentors under the real ``opentelemetry-instrument``: each one enabled records its
metrics, and ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS`` turns off exactly the ones it names; and
``rs.init`` wraps the collectives in a process that sees none of rankscope's entry points."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
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
keys = set(slot.recorder.recorded()) if slot.recorder else set()
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


WITHOUT_METADATA = """
import json, os, sys
from importlib.metadata import distributions, entry_points
import torch, torch.distributed as dist
import rankscope as rs
from rankscope.core import runtime as slot

dist.init_process_group("gloo", store=dist.FileStore(sys.argv[1], 1), rank=0, world_size=1)
original = dist.all_reduce
rs.init(experiment="no-entry-points")
wrapped = dist.all_reduce is not original and dist.all_reduce.__wrapped__ is original
dist.all_reduce(torch.ones(2))
calls = slot.recorder.accs["comm/all_reduce/calls"].sum if "comm/all_reduce/calls" in slot.recorder.accs else 0
rs.shutdown()
dist.destroy_process_group()
print(json.dumps({
    "rankscope": rs.__file__,
    "instrumentors": sorted(e.name for e in entry_points(group="opentelemetry_instrumentor")),
    "distributions": sorted({d.metadata["Name"] for d in distributions() if d.metadata["Name"]}),
    "wrapped": wrapped,
    "calls": calls,
}))
"""


def _site_packages_without_rankscope(into: Path) -> Path:
    """This environment's site-packages as links, less rankscope's metadata, editable finder and package."""
    into.mkdir()
    for site in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        for entry in Path(site).iterdir():
            name = entry.name.lower()
            if "rankscope" in name and (name.startswith("rankscope") or "editable" in name):
                continue
            if not (into / entry.name).exists():
                (into / entry.name).symlink_to(entry.resolve())
    return into


def test_init_wraps_the_collectives_from_a_source_tree_without_entry_points(tmp_path: Path) -> None:
    """``rs.init`` imports the collectives' wrappers (the layering contracts see that import): run
    from ``src`` with rankscope not installed, its collectives are still recorded."""
    site = _site_packages_without_rankscope(tmp_path / "site")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "OTEL_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(site)]), RANKSCOPE_CONSOLE="off")
    command = [sys.executable, "-S", "-c", WITHOUT_METADATA, str(tmp_path / "store")]  # -S: no site-packages, no .pth
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.splitlines()[-1])
    assert found["rankscope"] == str(ROOT / "src" / "rankscope" / "__init__.py")
    assert "torch" in found["distributions"] and "rankscope" not in found["distributions"]
    assert "torch_distributed" not in found["instrumentors"]
    assert found["wrapped"] is True and found["calls"] == 1
