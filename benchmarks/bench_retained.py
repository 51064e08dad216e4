"""What keeping finalized steps for late data costs a run (``sink.book.retained``, issue 50).

One run of ``--processes`` processes x ``--keys`` keys (MEAN, SUM and MAX in turn) for ``--steps``
steps (600: 10 minutes at 1 step/s), each step taken and finalized through a real ``StepBook`` and
its views built: with the default window (900 s, 64 MiB: every step kept) in memory, kept on disk
too (``durable.kept``: a sink with a state directory), and with none (``retain_seconds=0``), the
baseline measured in the same run: the ratios are what keeping costs per step. Then the window's
bytes and the file's after the run, and a late part of the oldest kept (packed) step against one
of the newest (live), each merged and its late update's view built. Each round runs every arm in a
fresh child process, alternately; median and range of rounds.

Run from the repository root:  python benchmarks/bench_retained.py [--keys 1000 --steps 600 --rounds 3]
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
import json, sys, tempfile, time
from pathlib import Path
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as mpb
from rankscope.core import names as attr
from rankscope.metrics.recorder import Recorder
from rankscope.metrics.reduce import Reduce
from rankscope.otlp.common import encode_resource, key_value
from rankscope.otlp.metrics import PointAttributes, encode
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb
from rankscope.sink import BookConfig, StepBook
from rankscope.sink.testing import KeptFile, Limits, Refusals, metrics_batches

processes, keys, steps, retain = (int(a) for a in sys.argv[1:5])
REDUCES = (Reduce.MEAN, Reduce.SUM, Reduce.MAX)


class Clock:
    now = 0.0

    def __call__(self):
        return self.now


def batches(rank, step):
    c = Recorder(streams=[])
    for k in range(keys):
        c.record(f"train/layer{k // 10}/m{k % 10}", float((rank * 7 + k + step) % 16) / 4, REDUCES[k % 3])
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
config = BookConfig(grace=5, retain_seconds=900.0 if retain else 0.0)
book = StepBook("bench", config, clock=clock)
directory = tempfile.mkdtemp()
if retain == 2:
    book.steps.retained.attach(KeptFile(Path(directory) / "kept.log"), clock())
inputs = [[batches(r, s) for r in range(processes)] for s in range(steps)]
took = 0.0
for step, per_rank in enumerate(inputs):
    clock.now = float(step)
    t = time.perf_counter()
    for found in per_rank:
        for batch in found:
            book.apply(batch, Refusals())
    views = [book.view(done) for done in book.finished()]
    took += time.perf_counter() - t
    assert [v.step for v in views] == [step], [v.step for v in views]
late = {}
for name, step in (("packed", 0), ("live", steps - 1)):
    extra = batches(processes, step)  # a process late to the whole step
    t = time.perf_counter()
    for batch in extra:
        book.apply(batch, Refusals())
    (update,) = [book.view(done) for done in book.late(force=True)]
    late[name] = time.perf_counter() - t
    assert update.late and (update.global_metrics or not retain)
status = book.steps.retained.status()
on_disk = (Path(directory) / "kept.log").stat().st_size if retain == 2 else 0
print(json.dumps({"per_step_us": took / steps * 1e6, "bytes": status["bytes"], "packed": status["packed"],
                  "late_packed_ms": late["packed"] * 1e3, "late_live_ms": late["live"] * 1e3, "disk": on_disk}))
"""


def run(processes: int, keys: int, steps: int, retain: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(processes), str(keys), str(steps), str(retain)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": "src"},
    )
    found: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return found


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"bench_retained: {args.processes} process(es) x {args.keys} keys x {args.steps} steps, {args.rounds} rounds")
    machine = platform.processor() or platform.machine()
    print(f"  machine: {machine}, {os.cpu_count()} cores, Python {platform.python_version()}")
    kept: list[dict[str, float]] = []
    disk: list[dict[str, float]] = []
    none: list[dict[str, float]] = []
    for _ in range(args.rounds):  # alternately: a slower second of the machine hits every arm
        none.append(run(args.processes, args.keys, args.steps, 0))
        kept.append(run(args.processes, args.keys, args.steps, 1))
        disk.append(run(args.processes, args.keys, args.steps, 2))
    print(f"  a step, nothing kept (baseline): {spread([n['per_step_us'] for n in none])} us")
    print(f"  a step, kept in memory:          {spread([k['per_step_us'] for k in kept])} us")
    print(f"  a step, kept on disk too:        {spread([d['per_step_us'] for d in disk])} us")
    for name, arm in (("in memory", kept), ("on disk too", disk)):
        ratios = [k["per_step_us"] / n["per_step_us"] for k, n in zip(arm, none, strict=True)]
        print(f"  ratio kept {name} / baseline: {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")
    size = statistics.median(k["bytes"] for k in kept)
    packed = statistics.median(k["packed"] for k in kept)
    per_key = size / max(1, packed) / args.keys
    print(f"  window after the run: {packed:.0f} steps packed, {size / 1e6:.2f} MB ({per_key:.1f} B a key)")
    print(f"  kept.log after the run: {statistics.median(d['disk'] for d in disk) / 1e6:.2f} MB")
    packed_ms, live_ms = spread([k["late_packed_ms"] for k in kept]), spread([k["late_live_ms"] for k in kept])
    print(f"  a late part and its update, packed step: {packed_ms} ms; live step: {live_ms} ms")


if __name__ == "__main__":
    main()
