"""record_metric cost next to the OpenTelemetry SDK's own instruments, measured in one run.

Prints ns/call (median over interleaved child processes) for: rankscope record_metric on a
float (a key's repeated value, and its first value of a step: 100 keys, the spares the export
thread recycles), ``flush(step)`` after 100 keys (timed alone), ``Tracer.step`` with its span
recorded (spans go to an OTLP receiver in another process), record_metric on an int, on a CPU
tensor, on a CUDA tensor (when there is a GPU); disabled; and the OTel SDK's Histogram.record
and Counter.add with the same attributes rankscope stamps; then the ratios the brief budgets.
Also ``record_sample`` of a five-field rollout row (ranked, and a random sample) next to what a
plain OTel program would do with the row: ``Logger.emit`` through the SDK's batch processor.
Every figure comes from fresh child processes, run in interleaved rounds, so a slow moment of
the machine hits every row alike.

``--before DIR`` also measures the rankscope rows with another checkout's ``src`` (e.g. a
``git worktree`` of an earlier commit) in the same interleaved rounds and prints after/before.

    python benchmarks/bench_record_metric.py [--rounds 5] [--before /tmp/old]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

N = 200_000
REPEATS = 5
SRC = Path(__file__).resolve().parent.parent / "src"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_overhead import Receiver  # noqa: E402 - an OTLP/gRPC receiver in its own process

CHILD = """
import statistics, sys, timeit
setup, stmt, n, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
namespace = {}
exec(setup, namespace)
timer = timeit.Timer(stmt, globals=namespace)
times = timer.repeat(repeat=repeats, number=n)
if "SPENT" in namespace:  # the statement times its own part (ns), e.g. flush without the records before it
    print(namespace["SPENT"][0] / (n * repeats))
else:
    print(statistics.median(times) / n * 1e9)
"""

RANKSCOPE_SETUP = """
import os, rankscope as rs, torch
os.environ["RANKSCOPE_CONSOLE"] = "off"  # no default console view: measured, not printed
rs.init(experiment="bench", role="bench")
t = torch.tensor(1.5)
g = torch.tensor(1.5, device="cuda") if torch.cuda.is_available() else None
x = 1.5
rs.record_metric("loss", x); rs.record_metric("count", 3); rs.record_metric("ct", t)
if g is not None:
    rs.record_metric("gt", g)
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

SAMPLE_SETUP = """
import itertools, os, random, rankscope as rs
os.environ["RANKSCOPE_CONSOLE"] = "off"  # no default console view: measured, not printed
rs.init(experiment="bench", role="bench")
rows = itertools.cycle([
    {"prompt": "q" * 40, "completion": "a" * 200, "reward": random.random(), "tokens": 128, "ok": True}
    for _ in range(1024)
])
"""

OTEL_LOG_SETUP = """
import itertools, random
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, InMemoryLogRecordExporter
provider = LoggerProvider()
provider.add_log_record_processor(BatchLogRecordProcessor(InMemoryLogRecordExporter()))
logger = provider.get_logger("bench")
rows = itertools.cycle([
    {"prompt": "q" * 40, "completion": "a" * 200, "reward": random.random(), "tokens": 128, "ok": True}
    for _ in range(1024)
])
attrs = {"rankscope.sample.table": "rollouts"}
"""

FIRST_SETUP = (
    RANKSCOPE_SETUP
    + """
from rankscope.core import runtime
r = runtime.get().recorder
KEYS = [f"k{i:03d}" for i in range(100)]
for k in KEYS:
    rs.record_metric(k, x)
PREFILLS = hasattr(r, "recorded")  # a checkout before it (--before) takes them from the spares
SPARES = hasattr(r, "spare")  # a checkout before recycling (--before) builds every first value
"""
)
FIRST_STMT = """
for k in KEYS:
    rs.record_metric(k, x)
if PREFILLS:
    pass  # MEAN keys: the next step starts with these accumulators, reset on the export thread
elif SPARES:
    r.spare, r.accs = r.accs, {}  # what the export thread's recycle leaves for the next step
else:
    r.accs = {}
"""
FLUSH_SETUP = (
    FIRST_SETUP
    + """
import time
clock, SPENT, STEP = time.perf_counter_ns, [0], [0]
"""
)
FLUSH_STMT = """
for k in KEYS:
    rs.record_metric(k, x)
t0 = clock()
rs.flush(STEP[0])
SPENT[0] += clock() - t0
STEP[0] += 1
"""
TRACE_SETUP = """
import os, rankscope as rs
rs.init(experiment="bench", role="bench", endpoint=os.environ["BENCH_OTLP_ENDPOINT"])  # spans are recorded
tracer = rs.Tracer("train").start()
"""
PER = "_CALLS_PER_STATEMENT"
"""A row's statement makes this many calls (ns/call divides by it); not passed to the child."""
STATEMENTS = "_STATEMENTS_PER_CALL"
"""A row whose statement times one call itself (``SPENT``) runs n / this many statements."""

Row = tuple[str, str, str, dict[str, str], bool]
ROWS: list[Row] = [  # (name, setup, statement, extra environment, a rankscope row)
    ("rankscope record_metric(float)", RANKSCOPE_SETUP, 'rs.record_metric("loss", x)', {}, True),
    ("rankscope record_metric(float), first of a step", FIRST_SETUP, FIRST_STMT, {PER: "100"}, True),
    ("rankscope flush(step) after 100 keys", FLUSH_SETUP, FLUSH_STMT, {STATEMENTS: "100"}, True),
    ("rankscope Tracer.step(phase), spans recorded", TRACE_SETUP, 'tracer.step("fwd")', {}, True),
    ("rankscope record_metric(int)", RANKSCOPE_SETUP, 'rs.record_metric("count", 3)', {}, True),
    ("rankscope record_metric(CPU tensor)", RANKSCOPE_SETUP, 'rs.record_metric("ct", t)', {}, True),
    (
        "rankscope record_metric, RANKSCOPE_DISABLE=1",
        "import rankscope as rs",
        'rs.record_metric("loss", 1.5)',
        {"RANKSCOPE_DISABLE": "1"},
        True,
    ),
    ("OTel SDK Histogram.record", OTEL_SETUP, "hist.record(1.5, attrs)", {}, False),
    ("OTel SDK Counter.add", OTEL_SETUP, "counter.add(1, attrs)", {}, False),
    (
        "rankscope record_sample(row, rank_by, k=8)",
        SAMPLE_SETUP,
        'rs.record_sample("rollouts", next(rows), rank_by="reward")',
        {},
        True,
    ),
    ("rankscope record_sample(row, random, k=8)", SAMPLE_SETUP, 'rs.record_sample("picks", next(rows))', {}, True),
    ("OTel SDK Logger.emit(row)", OTEL_LOG_SETUP, "logger.emit(body=next(rows), attributes=attrs)", {}, False),
]
CUDA_ROW: Row = ("rankscope record_metric(CUDA tensor)", RANKSCOPE_SETUP, 'rs.record_metric("gt", g)', {}, True)


def child_ns(src: Path, setup: str, stmt: str, env: dict[str, str], n: int) -> float:
    full = {k: v for k, v in os.environ.items() if not k.startswith("RANKSCOPE_")}
    path = os.pathsep.join([str(src), *filter(None, [os.environ.get("PYTHONPATH")])])  # src first, others kept
    full.update({k: v for k, v in env.items() if k not in (PER, STATEMENTS)}, PYTHONPATH=path)
    per = int(env.get(PER, "1"))
    statements = max(1, n // per // int(env.get(STATEMENTS, "1")))
    out = subprocess.run(
        [sys.executable, "-c", CHILD, setup, stmt, str(statements), str(REPEATS)],
        env=full,
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return float(out.stdout.strip().splitlines()[-1]) / per


def has_cuda() -> bool:
    probe = "import torch; print(torch.cuda.is_available())"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip() == "True"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of child processes")
    parser.add_argument("--before", type=Path, help="another checkout whose src/ to compare against")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 rounds, fewer calls")
    args = parser.parse_args()
    rounds, n = (2, 20_000) if args.quick else (args.rounds, N)
    rows = ROWS + ([CUDA_ROW] if has_cuda() else [])
    trees = [("after", SRC)] + ([("before", args.before / "src")] if args.before else [])
    found: dict[tuple[str, str], list[float]] = {}
    receiver = Receiver(max_seconds=7200)  # where the Tracer row's spans go (another process)
    os.environ["BENCH_OTLP_ENDPOINT"] = receiver.endpoint
    try:
        for r in range(rounds):
            order = trees if r % 2 == 0 else trees[::-1]
            for name, setup, stmt, env, ours in rows:
                for tree, src in order if ours else trees[:1]:
                    found.setdefault((name, tree), []).append(child_ns(src, setup, stmt, env, n))
            print(f"round {r + 1}/{rounds} done", file=sys.stderr, flush=True)
    finally:
        receiver.close()
    import torch

    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
        f"Python {platform.python_version()}, torch {torch.__version__}"
        + (f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else "")
    )
    median = {key: statistics.median(v) for key, v in found.items()}
    header = f"{'':48s} {'after':>9s}" + (f" {'before':>9s} {'after/before':>12s}" if args.before else "")
    print(header + "   (ns/call, median of rounds; spread min-max)")
    for name, *_, ours in rows:
        after = median[(name, "after")]
        spread = found[(name, "after")]
        line = f"{name:48s} {after:9.0f}"
        if args.before and ours:
            before = median[(name, "before")]
            line += f" {before:9.0f} {after / before:12.2f}"
        elif args.before:
            line += " " * 23
        print(f"{line}   [{min(spread):.0f}-{max(spread):.0f}]")
    rs_float = median[("rankscope record_metric(float)", "after")]
    off = median[("rankscope record_metric, RANKSCOPE_DISABLE=1", "after")]
    hist = median[("OTel SDK Histogram.record", "after")]
    print(f"ratio Histogram.record / record_metric(float): {hist / rs_float:.1f}x (budget >= 4x)")
    emit = median[("OTel SDK Logger.emit(row)", "after")]
    ranked = median[("rankscope record_sample(row, rank_by, k=8)", "after")]
    print(f"ratio Logger.emit(row) / record_sample(row, rank_by): {emit / ranked:.1f}x (no budget)")
    first = median[("rankscope record_metric(float), first of a step", "after")]
    flush = median[("rankscope flush(step) after 100 keys", "after")]
    step = median[("rankscope Tracer.step(phase), spans recorded", "after")]
    budgets = [
        f"float <= 500 ns: {'OK' if rs_float <= 500 else 'OVER'}",
        f"float (a repeated value) <= 150 ns (issue 29): {'OK' if rs_float <= 150 else 'OVER'}",
        f"a key's first value of a step <= 300 ns (issue 29): {'OK' if first <= 300 else 'OVER'}",
        f"flush with 100 keys <= 20 us (issue 29): {'OK' if flush <= 20_000 else 'OVER'}",
        f"Tracer.step <= 1.5 us (issue 29): {'OK' if step <= 1_500 else 'OVER'}",
        f"disabled <= 150 ns: {'OK' if off <= 150 else 'OVER'}",
        f"vs Histogram.record >= 4x: {'OK' if hist / rs_float >= 4 else 'UNDER'}",
    ]
    if ("rankscope record_metric(CUDA tensor)", "after") in median:
        cuda = median[("rankscope record_metric(CUDA tensor)", "after")]
        budgets.append(f"CUDA tensor <= 500 ns (issue 29): {'OK' if cuda <= 500 else 'OVER'}")
    print("budgets: " + "; ".join(budgets))


if __name__ == "__main__":
    main()
