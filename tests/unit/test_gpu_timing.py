"""The CUDA-event span processor's logic on CPU, through torch.cuda's event interface
(``tests/fake_cuda.py`` plays the GPU; ``tests/integration/test_cuda.py`` runs the real thing on a GPU)."""

from __future__ import annotations

import threading
import time

from opentelemetry.sdk.trace import TracerProvider

from rankscope.core import names as attr
from rankscope.tracing.gpu_timing import CudaTimingProcessor
from rankscope.tracing.spans import BufferProcessor, SpanBuffer, SpanRecord, now_ns

from ..fake_cuda import FakeCuda


def pipeline(fake: FakeCuda, **options: float) -> tuple[CudaTimingProcessor, SpanBuffer]:
    buffer = SpanBuffer(10_000)
    return CudaTimingProcessor(BufferProcessor(buffer), fake, **options), buffer  # type: ignore[arg-type]


def wait_for(buffer: SpanBuffer, n: int, timeout: float = 5.0) -> list[SpanRecord]:
    deadline = time.monotonic() + timeout
    while len(buffer) < n and time.monotonic() < deadline:
        time.sleep(0.002)
    return buffer.drain()


def test_spans_wait_for_their_events_and_get_gpu_times_without_blocking_the_caller() -> None:
    fake = FakeCuda(drift=2e-5)
    processor, buffer = pipeline(fake)
    try:
        start_cpu = now_ns()
        begin = processor.mark()
        fake.launch(60.0)  # 60 ms of kernels queued behind the start event
        end = processor.mark()
        span = SpanRecord("fwd", 1, 2, 0, start_cpu, now_ns())
        processor.submit(span, begin, end)
        assert processor.pending == 1 and len(buffer) == 0  # not exported before the GPU got there
        assert threading.get_ident() not in fake.waiting_threads  # the caller only recorded and queued
        (done,) = wait_for(buffer, 1)
        assert done is span and processor.pending == 0
        assert fake.waiting_threads  # the processor's own thread read the timings
        assert done.attributes[attr.TIMER] == "gpu"
        assert done.attributes[attr.CPU_START] == start_cpu and done.attributes[attr.CPU_END] - start_cpu < 5e6
        assert abs((done.end_time - done.start_time) / 1e6 - 60.0) < 3.0  # the GPU's 60 ms, not the CPU's ~0
        assert abs(done.end_time - fake.host_ns_of(end.event.at)) < 2e6  # on the host clock, within 2 ms
    finally:
        processor.shutdown()


def test_reanchoring_follows_a_drifting_gpu_clock() -> None:
    errors = {}
    for reanchor in (0.02, 1e9):
        fake = FakeCuda(drift=0.05)  # exaggerated: 5 %, so ~0.4 s of run drifts by ~20 ms
        processor, buffer = pipeline(fake, reanchor_s=reanchor)
        try:
            worst = 0.0
            for _ in range(20):
                begin, end = processor.mark(), processor.mark()
                processor.submit(SpanRecord("s", 1, 2, 0, now_ns(), now_ns()), begin, end)
                (done,) = wait_for(buffer, 1)
                worst = max(worst, abs(done.end_time - fake.host_ns_of(end.event.at)) / 1e6)
                time.sleep(0.02)
            errors[reanchor] = (worst, processor.anchors_made)
        finally:
            processor.shutdown()
    assert errors[0.02][1] >= 5 and errors[1e9][1] == 1
    assert errors[0.02][0] < 5.0 < errors[1e9][0]  # ms: renewed anchors keep up, a single one does not


def test_graph_capture_records_nothing_and_keeps_cpu_times() -> None:
    fake = FakeCuda()
    processor, buffer = pipeline(fake)
    try:
        fake.capturing = True
        begin, end = processor.mark(), processor.mark()
        assert begin is None and end is None and fake.records == 0
        span = SpanRecord("captured", 1, 2, 0, 100, 200)
        processor.submit(span, begin, end)
        (done,) = buffer.drain()
        assert (done.start_time, done.end_time) == (100, 200) and not done.attributes
    finally:
        processor.shutdown()


def test_force_flush_and_shutdown_drain_pending_spans_and_events_are_pooled() -> None:
    fake = FakeCuda()
    processor, buffer = pipeline(fake)
    for i in range(50):
        begin = processor.mark()
        fake.launch(1.0)
        processor.submit(SpanRecord("s", 1, i + 1, 0, now_ns(), now_ns()), begin, processor.mark())
    assert processor.force_flush(5000)
    assert len(buffer.drain()) == 50
    created = fake.events_created
    for i in range(50):  # completed events were returned to the pool and are reused
        begin = processor.mark()
        processor.submit(SpanRecord("s", 1, i + 1, 0, now_ns(), now_ns()), begin, processor.mark())
        processor.force_flush(5000)
    assert fake.events_created <= created + 2
    fake.launch(30.0)
    processor.submit(SpanRecord("last", 1, 99, 0, now_ns(), now_ns()), processor.mark(), processor.mark())
    processor.shutdown()  # waits for the GPU, then stops the poller
    assert [s.name for s in buffer.drain()][-1:] == ["last"]


def test_it_is_an_otel_span_processor_for_sdk_spans_too() -> None:
    fake = FakeCuda()
    processor, buffer = pipeline(fake)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    with provider.get_tracer("user").start_as_current_span("kernel"):
        fake.launch(25.0)
    (done,) = wait_for(buffer, 1)
    assert done.name == "kernel" and abs((done.end_time - done.start_time) / 1e6 - 25.0) < 3.0
    provider.shutdown()
