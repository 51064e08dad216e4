"""CUDA tensor values: no sync at record time, one batched copy read off-thread (marked ``gpu``)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

import rankscope as rs

pytestmark = pytest.mark.gpu


@contextmanager
def no_sync_allowed() -> Iterator[None]:
    """Any synchronizing CUDA call on this thread raises meanwhile. Turning the mode on warns
    that it is a prototype (a UserWarning the suite would turn into an error): only that call's
    warnings are silenced, nothing of what runs inside."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_cuda_values_are_not_synced_at_record_and_arrive_exactly(capsys: pytest.CaptureFixture[str]) -> None:
    rs.init(backends={"console": {"logging_mode": "global_reduce"}})
    values = [torch.tensor(float(i), device="cuda") for i in range(1, 5)]
    # Made before the no-sync block: ``torch.tensor(data, device="cuda")`` copies host data from
    # pageable memory, which CUDA's sync debug mode reports as a synchronizing call (the test's, not ours).
    half = torch.tensor([[0.5]], dtype=torch.float16, device="cuda")
    count = torch.tensor(7, device="cuda")
    with no_sync_allowed():
        for v in values:
            rs.record_metric("gpu_sum", v, rs.Reduce.SUM)
            rs.record_metric("gpu_max", v * 2, rs.Reduce.MAX)
        # Other shapes and dtypes, and a tensor with an autograd node: read in the same batch.
        rs.record_metric("gpu_grad", torch.ones(1, device="cuda", requires_grad=True).sum() * 3)
        rs.record_metric("gpu_half", half)
        rs.record_metric("gpu_int", count, rs.Reduce.SUM)
    rs.flush(0)
    rs.shutdown()
    out = capsys.readouterr().out
    assert "gpu_sum: 10.0" in out and "gpu_max: 8.0" in out
    assert "gpu_grad: 3.0" in out and "gpu_half: 0.5" in out and "gpu_int: 7.0" in out


