"""On a real CUDA device (marked ``gpu``): tensor values are not synced at record time and arrive
exactly (one batched copy read off-thread), and the GPU timer never syncs the caller and times the
kernels, through a real sink."""

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


def test_gpu_timer_never_syncs_the_caller_and_times_kernels(make_sink, tmp_path) -> None:
    import json
    import time

    out = tmp_path / "views.jsonl"
    sink = make_sink(backends={"jsonl": {"logging_mode": "global_reduce", "path": str(out)}})
    rs.init(experiment="cuda-trace", endpoint=sink.endpoint)
    a = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    peak_before = torch.cuda.max_memory_allocated()
    t0 = time.perf_counter()
    with no_sync_allowed(), rs.trace("train", timer="gpu", track_memory=True) as t:
        for _ in range(20):
            a = a @ a / 64.0
        t.step("mm")
        with rs.trace("inner", timer="gpu", track_memory=True):  # nested memory tracking
            b = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        t.step("alloc")
    caller_s = time.perf_counter() - t0
    rs.flush(0)
    torch.cuda.synchronize()
    gpu_s = time.perf_counter() - t0
    del b
    assert torch.cuda.max_memory_allocated() >= peak_before  # never reset behind other users' backs
    rs.shutdown()
    sink.finalize("cuda-trace")
    assert sink.wait_written("cuda-trace")
    view = {r["key"]: r["value"] for r in map(json.loads, out.read_text().splitlines()) if r["step"] == 0}
    print(f"caller {caller_s * 1e3:.2f} ms, GPU {gpu_s * 1e3:.2f} ms, view {view}")
    assert view["train/mm/duration_avg_s"] > caller_s  # measured on the GPU, beyond the caller's time
    assert view["train/total_duration_max_s"] >= view["train/mm/duration_max_s"]
    assert view["inner/memory_delta_end_start_avg_gb"] >= 0.24
    assert view["train/memory_peak_max_gb"] >= view["inner/memory_peak_max_gb"] >= 0.25
    spans = {s.name: s for s in sink.spans("cuda-trace")}
    assert spans["train/mm"].attributes["rankscope.timer"] == "gpu"
    assert spans["train/mm"].end_ns - spans["train/mm"].start_ns > caller_s * 1e9 * 0.5


def test_cuda_values_are_not_synced_at_record_and_arrive_exactly(capsys: pytest.CaptureFixture[str]) -> None:
    rs.init(backends={"console": {"logging_mode": "global_reduce", "format": "full"}})
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
        for _ in range(2):  # the second through the device path, detached there too
            rs.record_metric("gpu_grad", torch.ones(1, device="cuda", requires_grad=True).sum() * 3)
        rs.record_metric("gpu_half", half)
        rs.record_metric("gpu_int", count, rs.Reduce.SUM)
    rs.flush(0)
    rs.shutdown()
    out = capsys.readouterr().out
    assert "gpu_sum: 10.0" in out and "gpu_max: 8.0" in out
    assert "gpu_grad: 3.0" in out and "gpu_half: 0.5" in out and "gpu_int: 7.0" in out


def test_the_device_path_still_refuses_what_the_first_check_would() -> None:
    """After a key's first CUDA tensor, ``record_metric`` keeps one of its kind after a one-element
    check (``recording.record_metric``'s device path); anything else is checked in full, and raises."""
    rs.init(backends={})
    ok = torch.tensor(1.0, device="cuda")
    two = torch.ones(2, device="cuda")
    wide = torch.tensor(1.0, dtype=torch.complex64, device="cuda")
    with no_sync_allowed():
        rs.record_metric("gpu_key", ok)
        rs.record_metric("gpu_key", ok)  # the device path
    with pytest.raises(ValueError, match="gpu_key"):
        rs.record_metric("gpu_key", two)
    with pytest.raises(TypeError, match="gpu_key"):
        rs.record_metric("gpu_key", wide)
    with pytest.raises(ValueError, match="gpu_key"):
        rs.record_metric("gpu_key", ok, rs.Reduce.SUM)
    rs.flush(0)
    rs.shutdown()
