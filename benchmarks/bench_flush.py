"""flush() cost on the caller and telemetry overhead on a training loop, with a live OTLP receiver.

1. flush with 200 keys: time spent in the caller's thread (export runs in the background),
   with the endpoint up and with nothing listening there (the caller never waits for it).
2. a loop of ~20 ms steps (CPU matmuls) with 100 record_metric calls + flush per step,
   against the same loop without rankscope, measured in the same run. Budget: <= 1 %.

Run from the repository root:  python benchmarks/bench_flush.py
"""

from __future__ import annotations

import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import rankscope as rs

# The receiver runs in its own process, as a sink would: its CPU is not the job's.
RECEIVER = """
import sys, time
sys.path.insert(0, '.')
from tests.otlp_receiver import GrpcReceiver
r = GrpcReceiver()
print(r.endpoint, flush=True)
sys.stdin.read()
"""

KEYS = [f"train/metric_{i}" for i in range(200)]


def flush_cost(steps: int = 300) -> list[float]:
    costs = []
    for step in range(steps):
        for key in KEYS:
            rs.record_metric(key, 0.5)
        t0 = time.perf_counter()
        rs.flush(step)
        costs.append(time.perf_counter() - t0)
        time.sleep(0.005)  # let the export thread run, as a real step would
    return costs


def make_work() -> tuple[torch.Tensor, int]:
    torch.set_num_threads(1)
    a = torch.randn(256, 256)
    reps = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ a
        if time.perf_counter() - t0 >= 0.02:
            return a, reps
        reps *= 2


def loop(a: torch.Tensor, reps: int, steps: int, telemetry: bool) -> float:
    t0 = time.perf_counter()
    for step in range(steps):
        for _ in range(reps):
            a @ a
        if telemetry:
            for key in KEYS[:100]:
                rs.record_metric(key, 0.5)
            rs.flush(step)
    return time.perf_counter() - t0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    os.environ["RANKSCOPE_SHUTDOWN_TIMEOUT"] = "1"
    rs.init(experiment="bench-down", endpoint=f"127.0.0.1:{free_port()}")  # nothing listens there
    down = flush_cost(100)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the held steps are dropped at shutdown, as they should be
        rs.shutdown()
    receiver = subprocess.Popen(
        [sys.executable, "-c", RECEIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert receiver.stdout is not None
    rs.init(experiment="bench", endpoint=receiver.stdout.readline().strip())
    costs = flush_cost()
    a, reps = make_work()
    base, with_rs = [], []
    for _ in range(5):  # interleave so drift hits both sides equally
        base.append(loop(a, reps, 50, telemetry=False))
        with_rs.append(loop(a, reps, 50, telemetry=True))
    rs.force_flush(30)
    rs.shutdown()
    receiver.communicate(timeout=10)
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cpus, Python {platform.python_version()}, "
        f"torch {torch.__version__}"
    )
    costs_us = sorted(c * 1e6 for c in costs)
    print(
        f"flush() with 200 keys, caller thread: median {statistics.median(costs_us):.0f} us, "
        f"p99 {costs_us[int(len(costs_us) * 0.99)]:.0f} us (budget <= 1000 us)"
    )
    down_us = statistics.median(down) * 1e6
    print(
        f"flush() with 200 keys while the endpoint is down: median {down_us:.0f} us "
        f"= {down_us / statistics.median(costs_us):.2f}x the median with it up (the caller never waits for it)"
    )
    b, w = statistics.median(base), statistics.median(with_rs)
    print(
        f"training loop, 50 steps of {b / 50 * 1000:.1f} ms: without {b:.3f} s, with 100 metrics/step "
        f"{w:.3f} s, overhead {100 * (w - b) / b:+.2f} % (budget <= 1 %)"
    )
    print(f"points dropped: {rs.dropped_points()}")


if __name__ == "__main__":
    main()
