"""Sink ingest rate and step-finalization latency, next to a bare decode-and-walk.

One experiment of 1,024 simulated ranks x 200 keys (mean, sum, max, min and std, encoded by
rankscope's own encoder: ``bench_tree.template``) x 3 steps, sent as OTLP/gRPC by a client
process on the same box (pre-encoded requests; each step's 1,024 requests in flight at once) to
a sink in this process. Reported, as the median and range of interleaved repeats:

1. bare decode-and-walk of the same requests (ParseFromString + read every point's attributes
   and values): points/s, the baseline measured in this run;
2. sink ingest: points/s from the first request to the last step written to a view (checked
   edge, step alignment, exact running merge, view), and the ratio to (1) (budgets: >= 50 % of
   (1), and >= 100,000 points/s for this 1,024-rank experiment on a 2-core box);
3. the same with the write-ahead log (fsync before every answer), and its ratio to (2);
4. step-finalization latency: from the last request of a step being answered to that step's
   global view reaching the backend, p50/p99 (budget: p99 <= 1 s);
5. where the gap to (1) goes, stage by stage, each in this process on the same requests and
   interleaved with the rest: the edge alone (``metrics_batches``: the request read as bytes, every
   check, the rows), then the edge and the book (``Sink.export_metrics`` called directly: the
   run resolved, each part taken, admitted and merged, every step finalized and its view written),
   then (2) adds gRPC, the relay and a client on the same cores. Each stage's points/s and the
   microseconds per point it adds to the one before.

Run from the repository root:  python benchmarks/bench_sink.py [--ranks 1024 --keys 200 --repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import ClassVar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest  # noqa: E402

from bench_tree import BASE_STEP, for_step, template  # noqa: E402
from rankscope.backends.base import LoggerBackend, register_backend  # noqa: E402
from rankscope.sink import (  # noqa: E402
    BookConfig,
    Sink,
    SinkConfig,
)

STEPS = 3

CLIENT = """
import asyncio, json, sys, time
sys.path.insert(0, 'benchmarks')
import grpc
from bench_tree import template, for_step
endpoint, ranks, keys, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
bodies = [template(r, ranks, keys, 'bench') for r in range(ranks)]
requests = [[for_step(b, s, keys + 1) for b in bodies] for s in range(steps)]
retried = 0
RETRY = (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)  # retryable in OTLP/gRPC, as exporters do
async def send(export, body):
    global retried
    for attempt in range(3):
        try:
            return await export(body, timeout=120)
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in RETRY or attempt == 2:
                raise
            retried += 1
async def main():
    channel = grpc.aio.insecure_channel(endpoint)
    export = channel.unary_unary('/opentelemetry.proto.collector.metrics.v1.MetricsService/Export')
    await channel.channel_ready()
    start, cpu = time.time(), time.process_time()
    last_ack = {}
    for step in range(steps):
        await asyncio.gather(*(send(export, body) for body in requests[step]))
        last_ack[step] = time.time()
    await channel.close()
    cpu = time.process_time() - cpu
    print(json.dumps({'start': start, 'last_ack': last_ack, 'cpu': cpu, 'retried': retried}), flush=True)
asyncio.run(main())
"""


def decode_and_walk(bodies: list[bytes]) -> int:
    points = 0
    for body in bodies:
        request = ExportMetricsServiceRequest()
        request.ParseFromString(body)
        for rm in request.resource_metrics:
            {kv.key: kv.value for kv in rm.resource.attributes}
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    kind = metric.WhichOneof("data")
                    for point in getattr(metric, kind).data_points:
                        {kv.key: kv.value for kv in point.attributes}
                        points += 1
    return points


class Timing(LoggerBackend):
    written: ClassVar[dict[int, float]] = {}

    def log_batch(self, metrics, global_step, *args, **kwargs):  # type: ignore[no-untyped-def]
        Timing.written[global_step] = time.time()


CPU: dict[str, list[float]] = {"sink": [], "client": [], "retried": []}
"""CPU seconds of each gRPC run without the log: this process (the sink, gRPC's threads, the relay)
and the client process while it sends (its requests encoded before; it shares the 2 cores)."""


def measure(ranks: int, keys: int, state_dir: str | None) -> tuple[float, list[float]]:
    """(seconds from the first request to the last step's view, per-step finalization latencies)."""
    Timing.written.clear()
    cpu0 = time.process_time()
    sink = Sink(
        SinkConfig(
            grpc_port=0,
            http_port=None,
            backends={"timing": {"logging_mode": "global_reduce"}},
            state_dir=None if state_dir is None else Path(state_dir),
            book=BookConfig(grace=60, step_window=1 << 62),
        )
    ).start()
    try:
        client = subprocess.run(
            [sys.executable, "-c", CLIENT, sink.endpoint, str(ranks), str(keys), str(STEPS)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=600,
        )
        if client.returncode:  # say why: the client's own error, not just its exit status
            raise SystemExit(f"bench_sink: the client failed:\n{client.stderr[-3000:]}")
        report = json.loads(client.stdout.strip().splitlines()[-1])
        deadline = time.time() + 60
        while len(Timing.written) < STEPS and time.time() < deadline:
            time.sleep(0.01)
        if state_dir is None:
            CPU["sink"].append(time.process_time() - cpu0)
            CPU["client"].append(report["cpu"])
        CPU["retried"].append(report["retried"])
    finally:
        sink.stop()
    assert len(Timing.written) == STEPS, Timing.written
    ingest = max(Timing.written.values()) - report["start"]
    return ingest, [Timing.written[BASE_STEP + s] - report["last_ack"][str(s)] for s in range(STEPS)]


def edge_only(bodies: list[bytes]) -> int:
    """The sink's edge over ``bodies`` (read as bytes, checked, made rows), nothing taken further."""
    from rankscope.sink.testing import Limits, Refusals, metrics_batches

    limits, points = Limits(), 0
    for body in bodies:
        refused = Refusals()
        for batch in metrics_batches(body, limits, refused):
            points += batch.point_count
        assert refused.count == 0, refused.reasons
    return points


def in_process(bodies: list[bytes], steps: int) -> float:
    """Seconds for a sink called directly (no transport, no log) to take ``bodies`` and write
    every step's view: the edge, the run resolved, each part admitted and merged, finalized."""
    Timing.written.clear()
    sink = Sink(
        SinkConfig(
            grpc_port=None,
            http_port=None,
            backends={"timing": {"logging_mode": "global_reduce"}},
            book=BookConfig(grace=60, step_window=1 << 62),
        )
    ).start()
    try:
        t0 = time.time()
        for body in bodies:
            result = sink.export_metrics(body)
            assert result.rejected == 0, result.errors[:3]
        sink.finalize()
        deadline = time.time() + 60
        while len(Timing.written) < steps and time.time() < deadline:
            time.sleep(0.001)
        assert len(Timing.written) == steps, Timing.written
        return max(Timing.written.values()) - t0
    finally:
        sink.stop()


def spread(values: list[float], fmt: str = ",.0f") -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    register_backend("timing", Timing)
    templates = [template(r, args.ranks, args.keys, "bench") for r in range(args.ranks)]
    flat = [for_step(b, s, args.keys + 1) for s in range(STEPS) for b in templates]
    points = args.ranks * args.keys * STEPS

    bare, edge, book, plain, durable, latencies = [], [], [], [], [], []
    for _ in range(args.repeats):  # interleaved, so a slower minute of the machine hits all of them
        t0 = time.perf_counter()
        assert decode_and_walk(flat) >= points
        bare.append(points / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        assert edge_only(flat) == points
        edge.append(points / (time.perf_counter() - t0))
        book.append(points / in_process(flat, STEPS))
        seconds, late = measure(args.ranks, args.keys, None)
        plain.append(points / seconds)
        latencies += late
        with tempfile.TemporaryDirectory() as state_dir:
            seconds, _ = measure(args.ranks, args.keys, state_dir)
        durable.append(points / seconds)

    ratios = [p / b for p, b in zip(plain, bare, strict=True)]
    wal_ratios = [d / p for d, p in zip(durable, plain, strict=True)]
    latencies.sort()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"{args.ranks} ranks x {args.keys} keys x {STEPS} steps = {points:,} points, {args.repeats} repeats")
    print(f"bare decode-and-walk : {spread(bare)} points/s")
    print(f"sink ingest (gRPC)   : {spread(plain)} points/s = {spread(ratios, '.0%')} of bare decode")
    print(f"sink ingest with WAL : {spread(durable)} points/s = {spread(wal_ratios, '.0%')} of the sink without it")
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
    print(f"step finalization    : p50 {statistics.median(latencies) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms")
    print("where the gap goes, stage by stage (each stage's median; + us/point over the stage before):")
    stages = [("bare decode-and-walk", bare), ("the edge alone", edge), ("edge + book, called directly", book)]
    stages.append(("sink ingest (gRPC, relay, client)", plain))
    before = None
    for name, rates in stages:
        rate = statistics.median(rates)
        added = "" if before is None else f", +{1e6 / rate - 1e6 / before:.2f} us/point"
        print(f"  {name:<36}: {spread(rates)} points/s = {rate / statistics.median(bare):.0%} of bare decode{added}")
        before = rate
    sink_us = [c / points * 1e6 for c in CPU["sink"]]
    client_us = [c / points * 1e6 for c in CPU["client"]]
    print(
        f"  over gRPC, CPU per point: the sink's process {spread(sink_us, '.2f')} us (against bare decode's "
        f"{1e6 / statistics.median(bare):.2f}), the client's while sending {spread(client_us, '.2f')} us"
    )
    print(f"  calls the client retried (CANCELLED or UNAVAILABLE, as OTLP exporters do): {int(sum(CPU['retried']))}")


if __name__ == "__main__":
    main()
