"""CUDA tensor values: no sync at record time, one batched copy read off-thread. Needs a GPU."""

from __future__ import annotations

import pytest
import torch

import rankscope as rs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_cuda_values_are_not_synced_at_record_and_arrive_exactly(capsys: pytest.CaptureFixture[str]) -> None:
    rs.init(backends={"console": {"logging_mode": "global_reduce"}})
    values = [torch.tensor(float(i), device="cuda") for i in range(1, 5)]
    torch.cuda.set_sync_debug_mode("error")  # any synchronizing call below raises
    try:
        for v in values:
            rs.record_metric("gpu_sum", v, rs.Reduce.SUM)
            rs.record_metric("gpu_max", v * 2, rs.Reduce.MAX)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    rs.flush(0)
    rs.shutdown()
    out = capsys.readouterr().out
    assert "gpu_sum: 10.0" in out and "gpu_max: 8.0" in out
