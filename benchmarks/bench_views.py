"""What each view costs the sink per step (issue 54), against a view that does nothing.

Each arm is a child process that makes one view as a sink does (``make_view``, ``init`` with an
experiment and run), hands it ``--steps`` merged steps of ``--keys`` keys (``log_batch``, as the
sink's view thread does), and calls ``finish`` (the view drains what it buffered: the MLflow and
OTLP views send from threads of their own). The figure is the child's CPU over that loop, its
threads included, per step; the servers the views send to (``mlflow server``, the Collector and
Prometheus) are processes of their own, not counted. Arms run alternately, ``--rounds`` times;
each view's median and range, and its ratio to the JSONL view's of the same rounds (the plainest
view that keeps every value: the peer each view is judged against).

Views: ``none`` (the floor: ``LoggerBackend`` itself), ``jsonl``, ``console`` (its lines to a pipe),
``tensorboard``, ``wandb`` (offline), ``mlflow`` (a ``mlflow server`` with a SQLite store started
here, when MLflow is installed) and ``otlp`` (the built Collector with
``collector-config/remote-write.yaml`` into Debian's Prometheus, when both are there).

Run from the repository root:  python benchmarks/bench_views.py [--keys 100 --steps 200 --rounds 5]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import json, os, sys, time
from rankscope import Reduce
from rankscope.backends.base import LoggerBackend, Metric, make_view

name, options, keys, steps = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
view = LoggerBackend({"logging_mode": "global_reduce"}) if name == "none" else make_view(name, options)
view.init("bench", experiment="bench-views", run=f"run-{os.getpid()}")
names = [f"group{k % 10}/key{k}" for k in range(keys)]
batches = [[Metric(n, float(s * keys + k), Reduce.MEAN) for k, n in enumerate(names)] for s in range(steps)]
started = time.process_time()
for step, metrics in enumerate(batches):
    view.log_batch(metrics, step, per_process={}, late=False, missing=[], step_seconds=0.5)
view.finish()
cpu = time.process_time() - started
health = view.health() or {}
lost = sum(int(health.get(k) or 0) for k in ("dropped", "dropped_points", "refused", "refused_points"))
print(json.dumps({"cpu": cpu, "lost": lost}))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return True
        except OSError:
            time.sleep(0.3)
    return False


@contextlib.contextmanager
def started(command: list[str], health: str, env: dict[str, str] | None = None) -> Iterator[bool]:
    """A server process (its own process group), yielded once ``health`` answers; killed at the end."""
    with open(os.devnull, "wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=out, env=env, start_new_session=True)
    try:
        yield wait_http(health, 120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def run(name: str, options: dict[str, object], keys: int, steps: int, cwd: str) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "OTEL_", "WANDB_"))}
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-c", CHILD, name, json.dumps(options), str(keys), str(steps)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{name}: the child failed:\n{done.stderr[-3000:]}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    if found["lost"]:
        raise SystemExit(f"{name}: the view lost {found['lost']} entries; its figure would flatter it")
    return float(found["cpu"]) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--views", default="none,jsonl,console,tensorboard,wandb,mlflow,otlp")
    args = parser.parse_args()
    wanted = args.views.split(",")
    with contextlib.ExitStack() as stack:
        work = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-views-"))
        views: dict[str, dict[str, object]] = {
            "none": {},
            "jsonl": {"path": os.path.join(work, "m.jsonl")},
            "console": {},
            "tensorboard": {"logdir": os.path.join(work, "tb")},
            "wandb": {"dir": work},
        }
        mlflow = Path(sys.executable).with_name("mlflow")
        if "mlflow" in wanted and mlflow.exists():
            port = free_port()
            command = [str(mlflow), "server", "--backend-store-uri", f"sqlite:///{work}/mlflow.db"]
            command += ["--artifacts-destination", f"{work}/artifacts", "--host", "127.0.0.1", "--port", str(port)]
            if stack.enter_context(started([*command, "--workers", "1"], f"http://127.0.0.1:{port}/health")):
                views["mlflow"] = {"tracking_uri": f"http://127.0.0.1:{port}", "finish_timeout": 120}
        prometheus = shutil.which("prometheus")
        if "otlp" in wanted and prometheus is not None:
            binaries = subprocess.run(
                [sys.executable, str(ROOT / "scripts" / "build_pipeline.py")],
                capture_output=True,
                text=True,
                check=True,
            )
            otelcol = json.loads(binaries.stdout.strip().splitlines()[-1])["otelcol"]
            prom, grpc_port, health = free_port(), free_port(), free_port()
            Path(work, "prometheus.yml").write_text("global:\n  scrape_interval: 15s\n")
            command = [prometheus, f"--config.file={work}/prometheus.yml", f"--storage.tsdb.path={work}/prom"]
            command += [f"--web.listen-address=127.0.0.1:{prom}", "--web.enable-remote-write-receiver"]
            up = stack.enter_context(started(command, f"http://127.0.0.1:{prom}/-/ready"))
            env = {
                **os.environ,
                "OTLP_GRPC_ENDPOINT": f"127.0.0.1:{grpc_port}",
                "OTLP_HTTP_ENDPOINT": f"127.0.0.1:{free_port()}",
                "HEALTH_CHECK_ENDPOINT": f"127.0.0.1:{health}",
                "RANKSCOPE_REMOTE_WRITE_URL": f"http://127.0.0.1:{prom}/api/v1/write",
            }
            config = str(ROOT / "collector-config" / "remote-write.yaml")
            if up and stack.enter_context(started([otelcol, "--config", config], f"http://127.0.0.1:{health}/", env)):
                views["otlp"] = {"endpoint": f"http://127.0.0.1:{grpc_port}", "finish_timeout": 120}
        names = [n for n in wanted if n in views]
        skipped = [n for n in wanted if n not in views]
        if skipped:
            print(f"not measured (their server or package is missing here): {', '.join(skipped)}")
        cpu: dict[str, list[float]] = {n: [] for n in names}
        for i in range(args.rounds):
            order = names if i % 2 == 0 else names[::-1]
            for name in order:
                cpu[name].append(run(name, views[name], args.keys, args.steps, work))
            print(
                f"round {i + 1}/{args.rounds}: " + ", ".join(f"{n} {cpu[n][-1] * 1e6:.0f}" for n in names), flush=True
            )
    print(f"{platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"a step of {args.keys} keys, {args.steps} steps a child, {args.rounds} rounds: CPU µs per step")
    base = statistics.median(cpu["jsonl"]) if "jsonl" in cpu else None
    for name in names:
        median = statistics.median(cpu[name])
        ratio = f"  ratio to jsonl {median / base:.2f}x" if base else ""
        low, high = min(cpu[name]) * 1e6, max(cpu[name]) * 1e6
        print(f"{name:12s} {median * 1e6:8.0f} µs ({low:.0f}-{high:.0f}){ratio}")


if __name__ == "__main__":
    main()
