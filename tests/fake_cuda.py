"""A simulated CUDA device with torch.cuda's event interface, for testing GPU-timing logic on CPU.

Not a stand-in for the thing under test: ``CudaTimingProcessor`` is tested; this plays the
GPU. It has its own clock (offset and drift from the host clock, as a real GPU's has), one
compute stream that runs launched work in order, idle side streams, float32 ``elapsed_time``
and CUDA-graph capture mode — the properties the processor's logic depends on.
"""

from __future__ import annotations

import struct
import threading
import time


def _float32(value: float) -> float:
    return float(struct.unpack("f", struct.pack("f", value))[0])


class FakeCuda:
    def __init__(self, offset_ms: float = 7.2e6, drift: float = 0.0) -> None:
        self.origin = time.perf_counter_ns()
        self.offset_ms = offset_ms
        self.drift = drift
        self.busy_until = 0.0
        self.capturing = False
        self.events_created = 0
        self.records = 0
        self.waiting_threads: set[int] = set()  # threads that queried, waited on or read an event
        self._lock = threading.Lock()
        outer = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                assert enable_timing
                outer.events_created += 1
                self.at: float | None = None

            def record(self, stream: object = None) -> None:
                assert not outer.capturing, "recorded an event during CUDA-graph capture"
                outer.records += 1
                now = outer.gpu_ms()
                with outer._lock:
                    self.at = now if stream is not None else max(now, outer.busy_until)

            def query(self) -> bool:
                outer.waiting_threads.add(threading.get_ident())
                assert self.at is not None
                return outer.gpu_ms() >= self.at

            def synchronize(self) -> None:
                outer.waiting_threads.add(threading.get_ident())
                while not self.query():
                    time.sleep(0.0005)

            def elapsed_time(self, end: Event) -> float:
                outer.waiting_threads.add(threading.get_ident())
                assert self.query() and end.query(), "elapsed_time on an event that has not completed"
                return _float32(end.at - self.at)  # type: ignore[operator]

        class Stream:
            def __init__(self, device: int = 0) -> None:
                self.device = device

        self.Event = Event
        self.Stream = Stream

    def gpu_ms(self) -> float:
        host_ms = (time.perf_counter_ns() - self.origin) / 1e6
        return self.offset_ms + host_ms * (1.0 + self.drift)

    def host_ns_of(self, gpu_ms: float) -> int:
        """The true host wall-clock time (rankscope's clock) at a GPU time."""
        from rankscope.tracing.spans import CLOCK_OFFSET

        host_ms = (gpu_ms - self.offset_ms) / (1.0 + self.drift)
        return int(self.origin + host_ms * 1e6) + CLOCK_OFFSET

    def launch(self, ms: float) -> None:
        """Queue ``ms`` of kernel time on the compute stream (returns at once, like a launch)."""
        with self._lock:
            self.busy_until = max(self.busy_until, self.gpu_ms()) + ms

    def is_current_stream_capturing(self) -> bool:
        return self.capturing

    def current_device(self) -> int:
        return 0
