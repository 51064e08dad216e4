"""Overhead of the trainer instrumentation (grad norm off) on a CPU training step.

A child process trains a small MLP (DataLoader batch, forward, backward, AdamW step, loss
averaging all-reduce on a gloo group, a flush per step) while exporting to a real sink in
its own process. Arms alternate in rounds: the same loop with rankscope's torch
instrumentors (optimizer, DataLoader, collectives, checkpoint, memory) instrumented, and
uninstrumented (rankscope itself is on in both: this measures what the instrumentors add).
Per arm it reads the wall time, the training thread's CPU (``time.thread_time``), the export
thread's and the whole process's; the instrumented arm minus the uninstrumented one, as a % of
the uninstrumented step's training-thread CPU, is judged against issue 29's budgets (training
thread <= 0.5 %, export thread <= 1 %, whole process <= 2 %). ``--before DIR`` runs the same
children with another checkout's ``src``, alternating with this one's.

Run from the repository root:  python benchmarks/bench_instrument.py [--children N] [--before DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ROUNDS = 12
STEPS = 60
RESULT = "RESULT "
BUDGETS = {"training thread": 0.5, "export thread": 1.0, "whole process": 2.0}
"""Issue 29's budgets, in % of the uninstrumented step's training-thread CPU."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_sink() -> tuple[subprocess.Popen[bytes], str]:
    grpc_port = free_port()
    command = [sys.executable, "-m", "rankscope.cli", "sink", "--grpc-port", str(grpc_port), "--http-port", "0"]
    command += ["--backends", '{"jsonl": {"path": "/dev/null"}}']
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        command = ["taskset", "-c", str((os.cpu_count() or 2) - 1), *command]  # the sink on its own core
    sink = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", grpc_port)) == 0:
                return sink, f"127.0.0.1:{grpc_port}"
        time.sleep(0.05)
    raise RuntimeError("the sink did not start")


def make_trainer() -> tuple[Any, Any, Any]:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = torch.utils.data.TensorDataset(torch.randn(64 * STEPS, 512), torch.randn(64 * STEPS, 512))
    return model, optimizer, torch.utils.data.DataLoader(data, batch_size=64)


def run(model: Any, optimizer: Any, loader: Any, first: int) -> None:
    import torch
    import torch.distributed as dist

    import rankscope as rs

    for step, (x, y) in enumerate(loader, start=first):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        dist.all_reduce(loss.detach())
        rs.flush(step)


def _thread_cpu(name: str) -> float:
    """CPU seconds of this process's thread ``name`` (0 when it is not there or cannot be read)."""
    found = next((t for t in threading.enumerate() if t.name == name), None)
    if found is None or found.ident is None or not hasattr(time, "pthread_getcpuclockid"):
        return 0.0
    return time.clock_gettime(time.pthread_getcpuclockid(found.ident))


def child(src: Path) -> None:
    """One measured child: both arms in rounds, with ``src``'s rankscope; prints one JSON line."""
    sys.path.insert(0, str(src))
    import torch
    import torch.distributed as dist

    import rankscope as rs
    from rankscope.instrumentation import INSTRUMENTORS

    torch.set_num_threads(1)
    sink, endpoint = start_sink()
    arms: dict[str, dict[str, list[float]]] = {arm: {} for arm in ("off", "on")}
    try:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        rs.init(experiment=f"bench-instrument-{os.getpid()}", endpoint=endpoint)
        model, optimizer, loader = make_trainer()
        instrumentors = [INSTRUMENTORS[name]() for name in INSTRUMENTORS if name.startswith("torch_")]
        run(model, optimizer, loader, 0)  # warm-up
        step = STEPS
        for _ in range(ROUNDS):
            for arm in ("off", "on"):
                for instrumentor in instrumentors:
                    if arm == "on":
                        instrumentor.instrument()
                    elif instrumentor.is_instrumented_by_opentelemetry:
                        instrumentor.uninstrument()
                # The DataLoader iterator's wait is inside the step loop: time whole iterations.
                rs.force_flush(10)  # each arm's export is its own
                before = (time.perf_counter(), time.thread_time(), _thread_cpu("rankscope-export"), time.process_time())
                run(model, optimizer, loader, step)
                rs.force_flush(10)
                after = (time.perf_counter(), time.thread_time(), _thread_cpu("rankscope-export"), time.process_time())
                for name, a, b in zip(("wall", "training", "export", "process"), before, after, strict=True):
                    arms[arm].setdefault(name, []).append((b - a) / STEPS)
                step += STEPS
        for instrumentor in instrumentors:
            instrumentor.uninstrument()
        rs.shutdown()
    finally:
        sink.terminate()
        sink.wait(10)
    medians = {arm: {name: statistics.median(v) for name, v in found.items()} for arm, found in arms.items()}
    print(RESULT + json.dumps({"medians": medians, "torch": torch.__version__}), flush=True)


def run_child(src: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "OTEL_"))}
    env.update(OMP_NUM_THREADS="1", RANKSCOPE_SINK="off")
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(src)], capture_output=True, text=True, timeout=900, env=env
    )
    if done.returncode != 0:
        raise RuntimeError(f"child ({src}) failed:\n{done.stderr[-3000:]}")
    line = next(line for line in reversed(done.stdout.splitlines()) if line.startswith(RESULT))
    return dict(json.loads(line[len(RESULT) :]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--children", type=int, default=3, help="fresh child processes per checkout (default 3)")
    parser.add_argument("--before", type=Path, help="another checkout measured in alternation with this one")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child)
        return
    trees = {"after": ROOT / "src"} | ({"before": args.before / "src"} if args.before else {})
    results: dict[str, list[dict[str, Any]]] = {tree: [] for tree in trees}
    for index in range(args.children):
        for tree in trees if index % 2 == 0 else list(trees)[::-1]:
            results[tree].append(run_child(trees[tree]))
            print(f"child {index + 1}/{args.children} ({tree}) done", file=sys.stderr, flush=True)
    torch_version = next(iter(results.values()))[0]["torch"]
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch_version}")
    print(f"{args.children} children per checkout, each {ROUNDS} rounds x 2 arms x {STEPS} steps; medians of children")
    for tree, found in results.items():
        off = statistics.median(r["medians"]["off"]["training"] for r in found)
        wall = statistics.median(r["medians"]["off"]["wall"] for r in found)
        print(f"\n{tree}: uninstrumented step {wall * 1e3:.2f} ms wall, {off * 1e3:.2f} ms training-thread CPU")
        for label, name in (
            ("wall time", "wall"),
            ("training thread", "training"),
            ("export thread", "export"),
            ("whole process", "process"),
        ):
            deltas = [r["medians"]["on"][name] - r["medians"]["off"][name] for r in found]
            delta = statistics.median(deltas)
            budget = BUDGETS.get(label)
            verdict = (
                ""
                if budget is None
                else f"  (budget <= {budget:g} %: {'holds' if 100 * delta / off <= budget else 'NOT MET'})"
            )
            print(
                f"  instrumentors add, {label}: {delta * 1e6:+.0f} us = {100 * delta / off:+.2f} % "
                f"[{100 * min(deltas) / off:+.2f}, {100 * max(deltas) / off:+.2f}]{verdict}"
            )


if __name__ == "__main__":
    main()
