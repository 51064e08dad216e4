"""What judging every key's outliers costs a sink's step (``sink.book.spread``, ``book.outliers``; issue 52).

``--processes`` processes x ``--keys`` keys (MEAN, record_metric's default; noisy values, one
process off in one key) for ``--steps`` steps, each step taken through the sink's edge and a real
``StepBook``, finalized and its view built: with the outlier detector on (the default thresholds)
and off (``outlier_sigmas=0``), the baseline measured in the same run. Each round runs both arms in
fresh child processes, alternately; median and range of rounds, and the ratio.

Also the bytes a merged MEAN point gains by carrying its processes' spread (the Go merge
processor's ``rankscope.spread.*`` attributes), encoded as OTLP protobuf.

Run from the repository root:  python benchmarks/bench_outliers.py [--processes 1000 --keys 200 --steps 10 --rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

CHILD = """
import json, random, sys, time
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as mpb
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb
from rankscope.core import names as attr
from rankscope.core.anomalies import Outlier
from rankscope.metrics.recorder import Recorder
from rankscope.metrics.reduce import Reduce
from rankscope.otlp.common import encode_resource, key_value
from rankscope.otlp.metrics import PointAttributes, encode
from rankscope.sink import BookConfig, StepBook
from rankscope.sink.testing import Limits, Refusals, Thresholds, metrics_batches

processes, keys, steps, on = (int(a) for a in sys.argv[1:5])


class Clock:
    now = 0.0

    def __call__(self):
        return self.now


def batches(rank, step):
    rng = random.Random(rank * 7919 + step)
    c = Recorder(streams=[])
    for k in range(keys):
        off = 1.0 if (rank, k) == (3, 5) else 0.0
        c.record(f"train/layer{k // 10}/m{k % 10}", rng.gauss(1.0, 0.01) + off, Reduce.MEAN)
    request = mpb.ExportMetricsServiceRequest()
    resource = {attr.EXPERIMENT_ID: "bench", attr.SERVICE_INSTANCE_ID: f"p{rank}", attr.ROLE: "trainer",
                attr.RANK: str(rank), attr.WORLD_SIZE: str(processes)}
    rm = request.resource_metrics.add(resource=encode_resource(resource))
    metrics = [encode(k, acc, step, 0, 1, PointAttributes()) for k, acc in c.accs.items()]
    marker = pb.Metric(name=attr.FLUSH_MARKER)
    marker.sum.data_points.add(as_int=keys, attributes=[key_value(attr.STEP, step)], time_unix_nano=1)
    rm.scope_metrics.add().metrics.extend([*metrics, marker])
    return list(metrics_batches(request, Limits(max_points=1 << 30), Refusals()))


clock = Clock()
detectors = Thresholds(warmup_steps=0, outlier_steps=1) if on else Thresholds(outlier_sigmas=0)
book = StepBook("bench", BookConfig(grace=5, detectors=detectors), clock=clock)
inputs = [[batches(r, s) for r in range(processes)] for s in range(steps)]
took, named = 0.0, set()
for step, per_rank in enumerate(inputs):
    clock.now = float(step)
    t = time.perf_counter()
    for found in per_rank:
        for batch in found:
            book.apply(batch, Refusals())
    views = [book.view(done) for done in book.finished()]
    took += time.perf_counter() - t
    named |= {(a.process, a.key) for v in views for a in v.anomalies if isinstance(a, Outlier)}
assert named == ({("trainer_r3", "train/layer0/m5")} if on else set()), named
print(json.dumps({"per_step_ms": took / steps * 1e3}))
"""


def run(processes: int, keys: int, steps: int, on: int) -> float:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(processes), str(keys), str(steps), str(on)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": "src"},
    )
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return float(json.loads(out.stdout.strip().splitlines()[-1])["per_step_ms"])


def merged_point_bytes() -> tuple[int, int]:
    """A merged MEAN point's encoded size without and with its spread attributes."""
    from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb

    from rankscope.core import names as attr
    from rankscope.otlp.common import key_value

    point = pb.HistogramDataPoint(
        count=4096, sum=4123.5, bucket_counts=[4096], time_unix_nano=1, start_time_unix_nano=1
    )
    point.attributes.extend([key_value(attr.REDUCE, "mean"), key_value(attr.STEP, 123456)])
    plain = point.ByteSize()
    spread: dict[str, str | int | float] = {
        attr.SPREAD_N: 1024,
        attr.SPREAD_MEAN: 1.0067,
        attr.SPREAD_M2: 0.1021,
        attr.SPREAD_LOW: 0.9712,
        attr.SPREAD_LOW_RANK: 811,
        attr.SPREAD_LOW_LABEL: "trainer_r811",
        attr.SPREAD_HIGH: 1.9823,
        attr.SPREAD_HIGH_RANK: 3,
        attr.SPREAD_HIGH_LABEL: "trainer_r3",
    }
    point.attributes.extend(key_value(k, v) for k, v in spread.items())
    return plain, point.ByteSize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=1000)
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"bench_outliers: {args.processes} processes x {args.keys} keys x {args.steps} steps, {args.rounds} rounds")
    machine = platform.processor() or platform.machine()
    print(f"  machine: {machine}, {os.cpu_count()} cores, Python {platform.python_version()}")
    off: list[float] = []
    on: list[float] = []
    for i in range(args.rounds):  # alternately: a slower second of the machine hits both arms
        for arm in (0, 1) if i % 2 == 0 else (1, 0):
            (on if arm else off).append(run(args.processes, args.keys, args.steps, arm))
        print(f"  round {i + 1}: off {off[-1]:.1f} ms, on {on[-1]:.1f} ms a step", flush=True)
    ratios = [a / b for a, b in zip(on, off, strict=True)]
    print(f"  a step, outliers off (baseline): {statistics.median(off):.1f} ms ({min(off):.1f}-{max(off):.1f})")
    print(f"  a step, outliers judged:         {statistics.median(on):.1f} ms ({min(on):.1f}-{max(on):.1f})")
    print(f"  ratio: {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")
    plain, spread = merged_point_bytes()
    print(f"  a merged MEAN point: {plain} bytes, {spread} with its spread ({spread / plain:.1f}x)")


if __name__ == "__main__":
    main()
