"""One experiment of 1,024 ranks x 200 keys through agents -> gateway -> sink, next to the direct path.

The built Collector (``scripts/build_pipeline.py``) runs ``collector-config/agent.yaml`` N times
and ``gateway.yaml`` once; ``rankscope sink`` writes a JSONL global view. A sender process
replays pre-encoded OTLP (one request per rank per step, as rankscope's SDK encodes it: 200 keys
of five reduce types and a flush marker) at one step per period, each agent taking an equal
share of the ranks. Reported:

1. baseline, measured in this run: the same requests sent straight to a sink for a few steps:
   points the sink received per step and seconds per step;
2. the tree for ``--seconds``: sustained step rate, step-view latency p50/p99 (from the moment a
   step's requests start to the sink's view of it), CPU seconds per tier (agents, gateway, sink,
   sender), points the sink received per step and the ratio to (1);
3. nothing lost: every step of both runs written, no process missing, every value of the tree's
   steps equal to the direct path's for the same step.

Run from the repository root:  python benchmarks/bench_tree.py [--ranks 1024 --keys 200 --agents 4]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
BASE_STEP = 1 << 49  # every step's varint is 8 bytes long: a request is patched per step, not re-encoded
REDUCES = ("mean", "sum", "max", "min", "std")


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def template(
    rank: int, ranks: int, keys: int, experiment: str, step: int = BASE_STEP, values: list[list[float]] | None = None
) -> bytes:
    """Rank ``rank``'s request for ``step``, encoded by rankscope's own encoder. ``values[k]`` are
    key k's two values; without them they depend on the rank only, so one encoding serves every
    step (``for_step``)."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    from rankscope.core import names as attr
    from rankscope.metrics.reduce import Reduce
    from rankscope.otlp.common import encode_resource, key_value
    from rankscope.otlp.markers import add_flush_marker
    from rankscope.otlp.metrics import PointAttributes, encode

    request = ExportMetricsServiceRequest()
    rm = request.resource_metrics.add()
    rm.resource.CopyFrom(
        encode_resource(
            {
                attr.EXPERIMENT_ID: experiment,
                attr.ROLE: "trainer",
                attr.RANK: rank,
                attr.WORLD_SIZE: ranks,
                attr.SERVICE_NAME: "trainer",
                attr.SERVICE_INSTANCE_ID: f"rank-{rank}",
                attr.PROCESS_PID: rank + 1,
                attr.HOST_NAME: f"node{rank // 8}",
            }
        )
    )
    scope = rm.scope_metrics.add()
    scope.scope.name = attr.INSTRUMENTATION_SCOPE
    cache = PointAttributes()
    now = time.time_ns()
    for k in range(keys):
        reduce = Reduce.get(REDUCES[k % len(REDUCES)])
        acc = reduce.accumulator_class(reduce)
        for i in range(2):
            acc.append(values[k][i] if values is not None else float((rank * 7 + k + i) % 16) / 4)  # dyadic
        scope.metrics.append(encode(f"k{k:03d}", acc, step, now - 10**9, now, cache))
    add_flush_marker(scope, [key_value(attr.STEP, step)], keys, now - 10**9, now)
    return request.SerializeToString()


def for_step(body: bytes, step: int, points: int) -> bytes:
    old, new = b"\x18" + varint(BASE_STEP), b"\x18" + varint(BASE_STEP + step)
    assert body.count(old) == points, "the step attribute is not where the patch expects it"
    return body.replace(old, new)


SENDER = """
import asyncio, json, sys, time
sys.path.insert(0, 'benchmarks')
import grpc
from bench_tree import template, for_step
spec = json.loads(sys.argv[1])
ranks, keys, steps, period = spec['ranks'], spec['keys'], spec['steps'], spec['period']
bodies = [template(r, ranks, keys, spec['experiment']) for r in range(ranks)]
print(json.dumps({'ready': True, 'bytes_per_request': len(bodies[0])}), flush=True)
async def main():
    channels = [grpc.aio.insecure_channel(e) for e in spec['endpoints']]
    calls = [c.unary_unary('/opentelemetry.proto.collector.metrics.v1.MetricsService/Export') for c in channels]
    share = -(-ranks // len(calls))
    start = time.time()
    report = []
    for step in range(steps):
        at = start + step * period
        await asyncio.sleep(max(0.0, at - time.time()))
        sent = time.time()
        requests = [(calls[r // share], for_step(bodies[r], step, keys + 1)) for r in range(ranks)]
        await asyncio.gather(*(call(body, timeout=120) for call, body in requests))
        report.append({'step': step, 'sent': sent, 'acked': time.time()})
    for c in channels:
        await c.close()
    print(json.dumps({'steps': report}), flush=True)
asyncio.run(main())
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[Any], name: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{name} exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not answer")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Pipeline:
    """Child processes (own process groups), stopped together."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.procs = tmp, []  # type: ignore[var-annotated]

    def start(self, name: str, command: list[str], env: dict[str, str], health: str) -> subprocess.Popen[Any]:
        log = (self.tmp / f"{name}.log").open("w")
        proc = subprocess.Popen(
            command, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.procs.append(proc)
        wait_http(health, proc, name)
        return proc

    def sink(self, name: str) -> tuple[subprocess.Popen[Any], int, int]:
        grpc, http = free_port(), free_port()
        view = {"jsonl": {"logging_mode": "global_reduce", "path": str(self.tmp / f"{name}.jsonl")}}
        command = [sys.executable, "-m", "rankscope.cli", "sink", "--grpc-port", str(grpc), "--http-port", str(http)]
        command += ["--step-window", str(1 << 62)]  # its steps start at BASE_STEP (2**49), not near 0
        command += ["--backends", json.dumps(view), "--grace", "30", "--state-dir", str(self.tmp / f"{name}-state")]
        proc = self.start(name, command, {"PYTHONPATH": str(ROOT / "src")}, f"http://127.0.0.1:{http}/healthz")
        return proc, grpc, http

    def collector(self, binary: str, config: str, name: str, **env: str) -> tuple[subprocess.Popen[Any], str]:
        grpc, health = free_port(), free_port()
        env = {
            "OTLP_GRPC_ENDPOINT": f"127.0.0.1:{grpc}",
            "OTLP_HTTP_ENDPOINT": f"127.0.0.1:{free_port()}",
            "HEALTH_CHECK_ENDPOINT": f"127.0.0.1:{health}",
            "QUEUE_DIRECTORY": str(self.tmp / f"{name}-queue"),
            **env,
        }
        command = [binary, "--config", str(ROOT / "collector-config" / f"{config}.yaml")]
        return self.start(name, command, env, f"http://127.0.0.1:{health}/"), f"127.0.0.1:{grpc}"

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def status(http: int, experiment: str) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/rankscope/v1/status?experiment={experiment}") as r:
            return json.loads(r.read())  # type: ignore[no-any-return]
    except OSError:
        return {}


def send(spec: dict[str, Any]) -> tuple[list[dict[str, float]], int, float]:
    """Run the sender; its step report, request size and CPU seconds."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SENDER, json.dumps(spec)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert proc.stdout is not None
    size = json.loads(proc.stdout.readline())["bytes_per_request"]
    report = json.loads(proc.stdout.readline())["steps"]
    cpu = cpu_seconds(proc.pid)
    proc.wait(60)
    return report, size, cpu


def written(path: Path, steps: int, http: int, experiment: str, timeout: float) -> dict[int, dict[str, Any]]:
    """{step: {key: value, "_time": when the view was built}} once every step is written."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and status(http, experiment).get("last_written_step", -1) < BASE_STEP + steps - 1:
        time.sleep(0.25)
    rows: dict[int, dict[str, Any]] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        row = json.loads(line)
        mine = rows.setdefault(row["step"] - BASE_STEP, {"_time": row["time"]})
        mine[row["key"]] = row["value"]
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--period", type=float, default=1.0, help="seconds per step")
    parser.add_argument("--direct-steps", type=int, default=3)
    args = parser.parse_args()
    built = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build_pipeline.py")], capture_output=True, text=True, check=True
    )
    otelcol = json.loads(built.stdout.strip().splitlines()[-1])["otelcol"]
    points = args.ranks * args.keys
    print(
        f"bench_tree: {args.ranks} ranks x {args.keys} keys = {points:,} states per step; {platform.machine()}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}",
        flush=True,
    )

    with tempfile.TemporaryDirectory(prefix="rankscope-bench-tree-") as work:
        tmp = Path(work)
        pipeline = Pipeline(tmp)
        try:
            # 1. Baseline: straight to a sink.
            sink, grpc, http = pipeline.sink("direct")
            cpu0 = cpu_seconds(sink.pid)
            spec = {
                "ranks": args.ranks,
                "keys": args.keys,
                "steps": args.direct_steps,
                "period": 0.0,
                "experiment": "direct",
                "endpoints": [f"127.0.0.1:{grpc}"],
            }
            started = time.time()
            _, size, _ = send(spec)
            direct = written(tmp / "direct.jsonl", args.direct_steps, http, "direct", 600)
            direct_s = (max(r["_time"] for r in direct.values()) - started) / args.direct_steps
            direct_status = status(http, "direct")
            direct_cpu = cpu_seconds(sink.pid) - cpu0
            print(f"  request: {size:,} bytes per rank per step")
            print(
                f"  direct : {direct_status['points'] / args.direct_steps:>9,.0f} points/step at the sink, "
                f"{direct_s:.2f} s/step ({points / direct_s:,.0f} points/s), "
                f"sink CPU {direct_cpu / args.direct_steps:.2f} s/step",
                flush=True,
            )

            # 2. The tree.
            sink, grpc, http = pipeline.sink("tree")
            gateway, gateway_endpoint = pipeline.collector(
                otelcol, "gateway", "gateway", SINK_HOSTNAMES=f"[127.0.0.1:{grpc}]"
            )
            agents = [
                pipeline.collector(otelcol, "agent", f"agent{i}", GATEWAY_HOSTNAMES=f"[{gateway_endpoint}]")
                for i in range(args.agents)
            ]
            tiers = {"agents": [p for p, _ in agents], "gateway": [gateway], "sink": [sink]}
            before = {t: sum(cpu_seconds(p.pid) for p in ps) for t, ps in tiers.items()}
            steps = max(1, int(args.seconds / args.period))
            spec = {
                "ranks": args.ranks,
                "keys": args.keys,
                "steps": steps,
                "period": args.period,
                "experiment": "tree",
                "endpoints": [e for _, e in agents],
            }
            report, _, sender_cpu = send(spec)
            tree = written(tmp / "tree.jsonl", steps, http, "tree", 120)
            cpu = {t: sum(cpu_seconds(p.pid) for p in ps) - before[t] for t, ps in tiers.items()}
            tree_status = status(http, "tree")
        finally:
            pipeline.stop()

    latencies = [tree[int(r["step"])]["_time"] - r["sent"] for r in report if int(r["step"]) in tree]
    span = max(r["_time"] for r in tree.values()) - report[0]["sent"]
    per_step = tree_status["points"] / steps
    lost = [s for s in range(steps) if s not in tree or tree[s].get("rankscope/missing_processes")]
    lost += [s for s in range(args.direct_steps) if s not in direct or direct[s].get("rankscope/missing_processes")]
    differ = [
        (s, k)
        for s in range(min(steps, args.direct_steps))
        for k, v in direct.get(s, {}).items()
        if k.startswith("k") and tree.get(s, {}).get(k) != v
    ]
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
    direct_points = direct_status["points"] / args.direct_steps
    print(
        f"  tree   : {per_step:>9,.0f} points/step at the sink ({per_step / direct_points:.4f} x direct); "
        f"{len(tree)} of {steps} steps in {span:.1f} s = {len(tree) / span:.2f} steps/s sustained "
        f"({len(tree) * points / span:,.0f} states/s through the tree; direct at most {1 / direct_s:.2f} steps/s)"
    )
    print(f"           step-view latency p50 {q[49]:.2f} s, p99 {q[98]:.2f} s (last step {latencies[-1]:.2f} s)")
    by_tier = ", ".join(f"{t} {c / steps:.3f}" for t, c in cpu.items())
    print(f"           CPU s per step: {by_tier}, sender {sender_cpu / steps:.3f}")
    ratio = cpu["sink"] / steps / (direct_cpu / args.direct_steps)
    print(f"           sink CPU per step: {ratio:.4f} x direct")
    print(f"  lost steps: {lost or 'none'}; values differing from direct: {differ[:5] or 'none'}")
    return 1 if lost or differ else 0


if __name__ == "__main__":
    sys.exit(main())
