"""record_metric cost next to the OpenTelemetry SDK's own instruments, measured in one run.

Prints ns/call (median of repeats) for: rankscope record_metric on a float, on an int,
on a CPU tensor; disabled; and the OTel SDK's Histogram.record and Counter.add with the
same attributes rankscope stamps; then the ratios the brief budgets. Run:

    python benchmarks/bench_record_metric.py
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import timeit

N = 200_000
REPEATS = 7


def per_call_ns(stmt: str, setup: str) -> float:
    timer = timeit.Timer(stmt, setup=setup)
    runs = timer.repeat(repeat=REPEATS, number=N)
    return statistics.median(runs) / N * 1e9


ENABLED_SETUP = """
import rankscope as rs, torch
rs.init(experiment="bench", role="bench")
t = torch.tensor(1.5)
x = 1.5
rs.record_metric("loss", x); rs.record_metric("count", 3); rs.record_metric("ct", t)
"""

OTEL_SETUP = """
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
meter = provider.get_meter("bench")
hist = meter.create_histogram("loss")
counter = meter.create_counter("count")
attrs = {"rankscope.step": 0}
"""


def disabled_ns() -> float:
    # RANKSCOPE_DISABLE is read once per process, so measure it in a child process.
    code = (
        "import timeit,statistics,rankscope as rs;"
        "t=timeit.Timer('rs.record_metric(\"loss\", 1.5)', globals={'rs': rs});"
        f"print(statistics.median(t.repeat({REPEATS}, {N}))/{N}*1e9)"
    )
    env = {**os.environ, "RANKSCOPE_DISABLE": "1"}
    return float(
        subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True).stdout
    )


def main() -> None:
    rs_float = per_call_ns('rs.record_metric("loss", x)', ENABLED_SETUP)
    rs_int = per_call_ns('rs.record_metric("count", 3)', ENABLED_SETUP)
    rs_tensor = per_call_ns('rs.record_metric("ct", t)', ENABLED_SETUP)
    otel_hist = per_call_ns("hist.record(1.5, attrs)", OTEL_SETUP)
    otel_counter = per_call_ns("counter.add(1, attrs)", OTEL_SETUP)
    off = disabled_ns()
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
        f"Python {platform.python_version()}"
    )
    rows = [
        ("rankscope record_metric(float)", rs_float),
        ("rankscope record_metric(int)", rs_int),
        ("rankscope record_metric(CPU tensor)", rs_tensor),
        ("rankscope record_metric, RANKSCOPE_DISABLE=1", off),
        ("OTel SDK Histogram.record", otel_hist),
        ("OTel SDK Counter.add", otel_counter),
    ]
    for name, ns in rows:
        print(f"{name:48s} {ns:8.0f} ns/call")
    print(f"ratio Histogram.record / record_metric(float): {otel_hist / rs_float:.1f}x (budget >= 4x)")
    print(f"ratio Counter.add / record_metric(float):      {otel_counter / rs_float:.1f}x")
    print(
        f"budgets: float <= 500 ns: {'OK' if rs_float <= 500 else 'OVER'}; "
        f"disabled <= 150 ns: {'OK' if off <= 150 else 'OVER'}; "
        f"vs Histogram.record >= 4x: {'OK' if otel_hist / rs_float >= 4 else 'UNDER'}"
    )


if __name__ == "__main__":
    main()
