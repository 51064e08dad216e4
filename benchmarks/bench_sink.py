"""Sink ingest rate and step-finalization latency, next to a bare decode-and-walk.

256 simulated processes x 200 MEAN keys per step, sent as OTLP/gRPC by a client process
(pre-serialized requests, 4 sender threads) to a sink in this process. Reported:

1. bare decode-and-walk of the same requests (ParseFromString + read every point's
   attributes and values): points/s — the baseline, measured in this run;
2. sink ingest: points/s from the first request to the last step written to a view
   (decode, group, align, exact reduction, per-process values), and the ratio to (1)
   (budget: >= 50 %);
3. step-finalization latency: from the last process's request for a step being answered
   to that step's global view reaching the backend, p50/p99 (budget: p99 <= 1 s).

Run from the repository root:  python benchmarks/bench_sink.py
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import ClassVar

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pathlib import Path

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from rankscope.backends.base import LoggerBackend, register_backend
from rankscope.sink import Sink, SinkConfig

PROCESSES, KEYS, STEPS = 256, 200, 6

CLIENT = """
import json, sys, time, threading
STEPS = int(sys.argv[2])
sys.path.insert(0, '.')
import grpc
from benchmarks.bench_sink import build_requests
requests = build_requests()
channel = grpc.insecure_channel(sys.argv[1])
export = channel.unary_unary('/opentelemetry.proto.collector.metrics.v1.MetricsService/Export')
grpc.channel_ready_future(channel).result(timeout=30)
last_ack = {}
lock = threading.Lock()
def send(chunk):
    for step, body in chunk:
        export(body, timeout=60)
        with lock:
            last_ack[step] = time.time()
start = time.time()
for step in range(STEPS):
    mine = [(step, b) for b in requests[step]]
    threads = [threading.Thread(target=send, args=(mine[i::4],)) for i in range(4)]
    [t.start() for t in threads]; [t.join() for t in threads]
print(json.dumps({"start": start, "last_ack": last_ack}), flush=True)
"""


def build_requests() -> list[list[bytes]]:
    """Per step, one serialized request per process (values differ per process and key)."""
    from rankscope.core import names as attr
    from rankscope.metrics.recorder import Recorder
    from rankscope.metrics.reduce import Reduce
    from rankscope.otlp.common import encode_resource, key_value
    from rankscope.otlp.metrics import PointAttributes, encode

    out: list[list[bytes]] = []
    cache = PointAttributes()
    for step in range(STEPS):
        bodies = []
        for p in range(PROCESSES):
            c = Recorder(streams=[])
            for k in range(KEYS):
                c.record(f"train/key_{k}", float(p + k + step), Reduce.MEAN)
            request = ExportMetricsServiceRequest()
            resource = {
                attr.EXPERIMENT_ID: "bench",
                attr.SERVICE_INSTANCE_ID: f"p{p}",
                attr.ROLE: "trainer",
                attr.RANK: str(p),
                attr.WORLD_SIZE: str(PROCESSES),
                attr.EXPERIMENT_ATTEMPT: 0,
            }
            scope = request.resource_metrics.add(resource=encode_resource(resource)).scope_metrics.add()
            for key, acc in c.accs.items():
                metric = encode(key, acc, step, 0, 1, cache)
                assert metric is not None
                scope.metrics.append(metric)
            marker = scope.metrics.add(name=attr.FLUSH_MARKER)
            marker.sum.data_points.add(as_int=KEYS, attributes=[key_value(attr.STEP, step)])
            bodies.append(request.SerializeToString())
        out.append(bodies)
    return out


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


def main() -> None:
    register_backend("timing", Timing)
    requests = build_requests()
    flat = [b for step in requests for b in step]
    points = PROCESSES * KEYS * STEPS

    t0 = time.perf_counter()
    walked = decode_and_walk(flat)
    bare = time.perf_counter() - t0
    assert walked >= points

    def measure(state_dir: str | None) -> tuple[float, list[float]]:
        Timing.written.clear()
        sink = Sink(
            SinkConfig(
                grpc_port=0,
                http_port=None,
                backends={"timing": {"logging_mode": "global_reduce"}},
                grace=60,
                grpc_workers=4,
                state_dir=None if state_dir is None else Path(state_dir),
            )
        ).start()
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        client = subprocess.run(
            [sys.executable, "-c", CLIENT, sink.endpoint, str(STEPS)],
            capture_output=True,
            text=True,
            cwd=root,
            timeout=600,
            check=True,
        )
        report = json.loads(client.stdout.strip().splitlines()[-1])
        deadline = time.time() + 60
        while len(Timing.written) < STEPS and time.time() < deadline:
            time.sleep(0.01)
        sink.stop()
        assert len(Timing.written) == STEPS, Timing.written
        ingest = max(Timing.written.values()) - report["start"]
        return ingest, sorted(Timing.written[s] - report["last_ack"][str(s)] for s in range(STEPS))

    ingest, latencies = measure(None)
    with tempfile.TemporaryDirectory() as state_dir:
        durable, _ = measure(state_dir)

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"{PROCESSES} processes x {KEYS} keys x {STEPS} steps = {points} points")
    print(f"bare decode-and-walk : {points / bare:12,.0f} points/s")
    print(f"sink ingest (gRPC)   : {points / ingest:12,.0f} points/s  ({bare / ingest:.0%} of bare decode)")
    print(f"sink ingest with WAL : {points / durable:12,.0f} points/s  ({ingest / durable:.0%} of the sink without it)")
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
    print(f"step finalization    : p50 {statistics.median(latencies) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms")


if __name__ == "__main__":
    main()
