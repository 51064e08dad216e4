"""The NVML instrumentor (issue 17, item 4) in a fresh process: without a GPU silently off (no
warning, no ``gpu/`` keys beside the run's own); on a real device (marked ``gpu``) every metric read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..conftest import run_python

JOB = """
import json, sys, warnings
warnings.simplefilter("error")
from rankscope.instrumentation import GpuHealthInstrumentor
GpuHealthInstrumentor().instrument()
import torch, rankscope as rs
rs.init(experiment="nvml-off", backends={"jsonl": {"logging_mode": "per_rank_reduce", "path": sys.argv[1]}})
for step in range(3):
    rs.record_metric("loss", 1.0)
    rs.flush(step)
rs.shutdown()
"""


def test_without_a_gpu_the_instrumentor_is_silently_off(tmp_path: Path) -> None:
    out = tmp_path / "rank.jsonl"
    done = run_python(f"import sys; sys.argv = ['job', {str(out)!r}]\n" + JOB)
    assert done.returncode == 0 and done.stderr == "", done.stderr[-2000:]
    keys = {json.loads(line)["key"] for line in out.read_text().splitlines()}
    assert "loss" in keys and not any(k.startswith("gpu/") for k in keys)


ON_DEVICE = """
import json, sys, time
from rankscope.instrumentation import GpuHealthInstrumentor
GpuHealthInstrumentor().instrument()
import torch, rankscope as rs
rs.init(experiment="nvml-on", backends={"jsonl": {"logging_mode": "per_rank_reduce", "path": sys.argv[1]}})
a = torch.randn(4096, 4096, device="cuda")
for step in range(6):
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:  # keep the device busy while NVML samples it
        a = a @ a / 64.0
    torch.cuda.synchronize()
    rs.record_metric("loss", 1.0)
    rs.flush(step)
rs.shutdown()
"""


@pytest.mark.gpu
def test_on_a_real_device_every_health_metric_is_read(tmp_path: Path) -> None:
    """Issue 17's open must-show: NVML's answers from the real device, per rank, at each flush (one
    flush behind: a flush records the sample the one before asked for)."""
    out = tmp_path / "rank.jsonl"
    done = run_python(f"import sys; sys.argv = ['job', {str(out)!r}]\n" + ON_DEVICE, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    by_key: dict[str, list[float]] = {}
    for row in rows:
        by_key.setdefault(row["key"], []).append(row["value"])
    print({k: v for k, v in by_key.items() if k.startswith("gpu/")})
    for key in ("gpu/utilization", "gpu/power_w", "gpu/temperature_c", "gpu/sm_clock_mhz", "gpu/throttled"):
        assert len(by_key.get(key, ())) >= 4, (key, sorted(by_key))
    assert all(0 <= v <= 100 for v in by_key["gpu/utilization"] + by_key.get("gpu/memory_bandwidth_utilization", []))
    assert max(by_key["gpu/utilization"]) > 0  # the matmuls kept it busy
    assert all(0 < v < 2000 for v in by_key["gpu/power_w"])
    assert all(0 < v < 120 for v in by_key["gpu/temperature_c"])
    assert all(v > 0 for v in by_key["gpu/sm_clock_mhz"])
    assert set(by_key["gpu/throttled"]) <= {0.0, 1.0}
    assert all(v >= 0 for v in by_key.get("gpu/ecc_errors", []) + by_key.get("gpu/xid_errors", []))
