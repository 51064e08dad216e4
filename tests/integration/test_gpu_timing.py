"""GPU-timed phases through a real sink: the duration metrics and spans come from CUDA events read
off the caller's thread (``tests/fake_cuda.py`` plays the GPU; ``tests/integration/test_cuda.py``
runs the real thing on a GPU)."""

from __future__ import annotations

import threading

import rankscope as rs
from rankscope.core import names as attr
from rankscope.core import runtime as rs_slot
from rankscope.tracing.gpu_timing import CudaTimingProcessor

from ..fake_cuda import FakeCuda


def test_gpu_timer_metrics_come_from_events_read_off_the_callers_thread(make_sink, tmp_path) -> None:
    import json

    out = tmp_path / "views.jsonl"
    sink = make_sink(backends={"jsonl": {"logging_mode": "global_reduce", "path": str(out)}})
    rs.init(experiment="gpu-metrics", endpoint=sink.endpoint)
    fake = FakeCuda()
    state = rs_slot.current.tracing  # type: ignore[union-attr]
    state._gpu, state._gpu_checked = CudaTimingProcessor(state.processor, fake), True  # type: ignore[arg-type]
    with rs.trace("train", timer="gpu") as t:
        fake.launch(40.0)
        t.step("fwd")
        fake.launch(20.0)
        t.step("bwd")
    rs.flush(0)
    assert threading.get_ident() not in fake.waiting_threads  # 60 ms of GPU work; the caller never waited for it
    rs.shutdown()
    sink.finalize("gpu-metrics")
    assert sink.wait_written("gpu-metrics")
    view = {r["key"]: r["value"] for r in map(json.loads, out.read_text().splitlines()) if r["step"] == 0}
    assert abs(view["train/fwd/duration_avg_s"] - 0.040) < 0.004
    assert abs(view["train/bwd/duration_max_s"] - 0.020) < 0.004
    assert abs(view["train/total_duration_avg_s"] - 0.060) < 0.006
    spans = {s.name: s for s in sink.spans("gpu-metrics")}
    assert spans["train/fwd"].attributes[attr.TIMER] == "gpu"
    assert abs((spans["train"].end_ns - spans["train"].start_ns) / 1e9 - 0.060) < 0.006
