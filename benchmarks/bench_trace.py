"""Span cost of ``trace(...).step(...)`` next to an OTel SDK span, and tracing overhead on a training loop.

Both measured in one run against a real sink in its own process (spans are exported, as in a job):

1. one phase span: ``Tracer.step(name)`` (a span plus its two duration metrics) vs the OTel SDK's
   cheapest span (``tracer.start_span(name).end()``, BatchSpanProcessor + OTLP exporter to the same
   sink). Budget: at least 3x cheaper.
2. a loop of ~20 ms CPU steps with 10 traced phases and 100 record_metric calls + flush per step,
   against the same loop without rankscope, interleaved. Budget: <= 1 %.

Run from the repository root:  python benchmarks/bench_trace.py
"""

from __future__ import annotations

import os
import platform
import socket
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import rankscope as rs

N = 20_000
REPEATS = 7
KEYS = [f"train/metric_{i}" for i in range(100)]
PHASES = [f"phase_{i}" for i in range(10)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_sink() -> tuple[subprocess.Popen[bytes], str]:
    grpc_port, http_port = free_port(), free_port()
    command = [sys.executable, "-m", "rankscope.cli", "sink", "--grpc-port", str(grpc_port)]
    command += ["--http-port", str(http_port), "--backends", '{"jsonl": {"path": "/dev/null"}}']
    if hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) >= 2:
        # The sink stays on one core (on a cluster it runs on its own host).
        command = ["taskset", "-c", str(max(os.sched_getaffinity(0))), *command]
    sink = subprocess.Popen(command, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", grpc_port)) == 0:
                return sink, f"127.0.0.1:{grpc_port}"
        time.sleep(0.05)
    raise RuntimeError("the sink did not start")


def rankscope_step_ns() -> float:
    runs = []
    for _ in range(REPEATS):
        t = rs.Tracer("bench").start()
        step = t.step
        t0 = time.perf_counter_ns()
        for _ in range(N):
            step("phase")
        runs.append((time.perf_counter_ns() - t0) / N)
        t.stop()
        rs.flush(0)
        rs.force_flush(30)  # export between repeats, untimed: the span buffer never fills
    return statistics.median(runs)


def otel_span_ns(endpoint: str | None) -> float:
    """The SDK's cheapest span; with an endpoint, exported as a job would (batch + OTLP), else bare."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider()
    if endpoint is not None:  # a queue that holds a whole repeat, so no span is dropped
        exporter = OTLPSpanExporter(endpoint=f"http://{endpoint}")
        provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=2 * N))
    tracer = provider.get_tracer("bench")
    runs = []
    for _ in range(REPEATS):
        t0 = time.perf_counter_ns()
        for _ in range(N):
            tracer.start_span("phase").end()
        runs.append((time.perf_counter_ns() - t0) / N)
        provider.force_flush()
    provider.shutdown()
    return statistics.median(runs)


def make_work() -> tuple[torch.Tensor, int]:
    """Matmul repetitions for one phase: 10 phases make a ~20 ms step."""
    torch.set_num_threads(1)
    a = torch.randn(128, 128)
    for _ in range(100):  # warm up before calibrating
        a @ a
    reps = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ a
        if time.perf_counter() - t0 >= 0.002:
            return a, reps
        reps *= 2


def loop(a: torch.Tensor, reps: int, steps: int, first: int, telemetry: bool) -> float:
    t0 = time.perf_counter()
    for step in range(first, first + steps):
        if telemetry:
            with rs.trace("train") as t:
                for phase in PHASES:
                    for _ in range(reps):
                        a @ a
                    t.step(phase)
            for key in KEYS:
                rs.record_metric(key, 0.5)
            rs.flush(step)
        else:
            for _phase in PHASES:
                for _ in range(reps):
                    a @ a
    return time.perf_counter() - t0


def main() -> None:
    sink, endpoint = start_sink()
    try:
        rs.init(experiment="bench-trace", endpoint=endpoint)
        ours = rankscope_step_ns()
        sdk = otel_span_ns(endpoint)
        sdk_bare = otel_span_ns(None)
        a, reps = make_work()
        base, with_rs = [], []
        step = 1
        for _ in range(5):  # interleaved so drift hits both sides equally
            base.append(loop(a, reps, 50, step, telemetry=False))
            with_rs.append(loop(a, reps, 50, step, telemetry=True))
            step += 50
        rs.force_flush(30)
        dropped = rs.dropped_points()
        rs.shutdown()
    finally:
        sink.terminate()
        sink.wait(10)
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cpus, Python {platform.python_version()}, "
        f"torch {torch.__version__}"
    )
    print(f"Tracer.step (span + 2 duration metrics): {ours:.0f} ns")
    print(f"OTel SDK span (start_span().end(), batch + OTLP): {sdk:.0f} ns")
    print(f"OTel SDK span, no processor at all: {sdk_bare:.0f} ns")
    print(f"ratio: rankscope is {sdk / ours:.1f}x cheaper than an exported SDK span (budget >= 3x), ")
    print(f"       {sdk_bare / ours:.1f}x cheaper than a bare SDK span")
    b, w = statistics.median(base), statistics.median(with_rs)
    print(
        f"training loop, 50 steps of {b / 50 * 1000:.1f} ms: without {b:.3f} s, with 10 traced phases + "
        f"100 metrics/step {w:.3f} s, overhead {100 * (w - b) / b:+.2f} % (budget <= 1 %)"
    )
    print(f"points dropped: {dropped}")


if __name__ == "__main__":
    main()
