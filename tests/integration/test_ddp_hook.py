"""DDP's gradient all-reduces seen (``tracing.ddp``), in a real one-rank gloo world: each bucket a
``comm/all_reduce`` of the routed ``allreduce_hook``, the same gradients as DDP's C++ hook gives;
a hook the user registers later (their own, or a built-in one) takes the route's place instead of
failing as a second registration; ``RANKSCOPE_COLLECTIVES=0`` leaves DDP as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import json, sys
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
import rankscope as rs
from rankscope.core import runtime as slot

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
rs.init(experiment="ddp-hook", backends={"console": {"format": "off"}})

def model():
    torch.manual_seed(0)
    layers = [torch.nn.Linear(64, 64) for _ in range(3)]
    return DistributedDataParallel(torch.nn.Sequential(*layers), bucket_cap_mb=0.01)

def grads(ddp):
    for _ in range(2):  # the second iteration runs on the rebuilt buckets (the first is one large one)
        ddp.zero_grad()
        torch.manual_seed(1)
        ddp(torch.randn(8, 64)).pow(2).sum().backward()
    return torch.cat([p.grad.flatten() for p in ddp.parameters()])

def calls():
    acc = slot.recorder.accs.get("comm/all_reduce/calls")
    return 0 if acc is None else acc.sum

torch.manual_seed(0)
plain = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(3)])
torch.manual_seed(1)
plain(torch.randn(8, 64)).pow(2).sum().backward()
expected = torch.cat([p.grad.flatten() for p in plain.parameters()])

out = {}
before = calls()
routed = grads(model())
out["routed_calls"] = calls() - before
out["routed_equal"] = bool(torch.allclose(routed, expected))

mine = []
def my_hook(state, bucket):
    mine.append(bucket.index())
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])

user = model()
user.register_comm_hook(None, my_hook)  # after the route: it takes its place, no "only once" error
before = calls()
out["user_equal"] = bool(torch.allclose(grads(user), expected))
out["user_buckets"], out["user_calls"] = len(mine), calls() - before

try:
    user.register_comm_hook(None, my_hook)  # a second hook: refused, as torch refuses it
    out["second"] = "taken"
except RuntimeError as exc:
    out["second"] = str(exc)

builtin = model()
builtin._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)
before = calls()
out["fp16_close"] = bool(torch.allclose(grads(builtin), expected, rtol=1e-2, atol=1e-2))
out["fp16_calls"] = calls() - before
rs.shutdown()
dist.destroy_process_group()
print(json.dumps(out))
"""


MADE_BEFORE = """
import json
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
import rankscope as rs
from rankscope.core import runtime as slot

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
torch.manual_seed(0)
ddp = DistributedDataParallel(torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(3)]), bucket_cap_mb=0.01)
mine = DistributedDataParallel(torch.nn.Linear(64, 64))
hooked = []
def my_hook(state, bucket):
    hooked.append(bucket.index())
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])
mine.register_comm_hook(None, my_hook)
builtin = DistributedDataParallel(torch.nn.Linear(64, 64))
builtin._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)  # before: kept, not a second hook

def iterate(model):
    model.zero_grad()
    model(torch.randn(8, 64)).pow(2).sum().backward()

def calls():
    acc = slot.recorder.accs.get("comm/all_reduce/calls") if slot.recorder is not None else None
    return 0 if acc is None else acc.sum

iterate(ddp)  # before rankscope started: DDP's C++ hook, unseen
rs.record_metric("loss", 1.0)  # the first call starts rankscope from the environment (no rs.init)
out = {}
before = calls()
for _ in range(2):
    iterate(ddp)
out["calls"] = calls() - before
before = calls()
iterate(mine)
out["mine"] = [len(hooked), calls() - before]  # the hook it had runs (through the wrappers), nothing refused
before = calls()
iterate(builtin)
out["builtin"] = calls() - before  # DDP's C++ hook: unseen, and no error
rs.shutdown()
dist.destroy_process_group()
print(json.dumps(out))
"""


def _run(tmp_path: Path, script: str = SCRIPT, **env: str) -> dict[str, object]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "OTEL_"))}
    # The script reads the calls off the live accumulator: no periodic export may take it meanwhile
    # (a second's interval did, on a loaded box, between one model's two iterations).
    environ |= {"RANKSCOPE_RUNTIME_DIR": str(tmp_path / "run"), "RANKSCOPE_EXPORT_INTERVAL": "3600", **env}
    result = subprocess.run(
        [sys.executable, "-c", script], env=environ, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "internal error" not in result.stderr, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.timeout(150)
def test_each_bucket_is_seen_and_a_later_hook_takes_the_routes_place(tmp_path: Path) -> None:
    found = _run(tmp_path)
    assert found["routed_equal"] is True and found["routed_calls"] >= 3, found  # ~4 buckets of 16 KiB
    assert found["user_equal"] is True and found["user_buckets"] == found["user_calls"] >= 3, found
    assert found["fp16_close"] is True and found["fp16_calls"] == found["routed_calls"], found
    assert "only be called once" in str(found["second"]), found


@pytest.mark.timeout(150)
def test_with_the_collectives_off_ddp_keeps_its_own_hook_and_registers_as_before(tmp_path: Path) -> None:
    found = _run(tmp_path, RANKSCOPE_COLLECTIVES="0")
    assert found["routed_equal"] is True and found["routed_calls"] == 0, found
    assert found["user_equal"] is True and found["user_buckets"] >= 3 and found["user_calls"] == 0, found
    assert found["fp16_close"] is True and found["fp16_calls"] == 0, found
    assert "only be called once" in str(found["second"]), found  # the same refusal without rankscope


@pytest.mark.timeout(150)
def test_a_module_made_before_rankscope_started_is_routed_at_its_next_forward(tmp_path: Path) -> None:
    """The tutorial's script: no ``rs.init``, its first rankscope call after ``DDP(...)``. Its
    buckets are seen from the next iteration; a module that had a hook of its own (Python or
    built-in) keeps it, with no error."""
    found = _run(tmp_path, MADE_BEFORE, RANKSCOPE_BACKENDS='{"console": {"format": "off"}}')
    assert found["calls"] >= 2 * 3, found  # ~4 buckets of 16 KiB an iteration, both iterations
    assert found["mine"] == [1, 1] and found["builtin"] == 0, found
