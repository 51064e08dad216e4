"""Overhead of the trainer instrumentation (grad norm off) on a CPU training step.

One process trains a small MLP (DataLoader batch, forward, backward, AdamW step, loss
averaging all-reduce on a gloo group, a flush per step) while exporting to a real sink in
its own process. Arms alternate in rounds: the same loop with rankscope's torch
instrumentors (optimizer, DataLoader, collectives, checkpoint, memory) instrumented, and
uninstrumented. The difference of the median step times is the instrumentation's cost.
Budget: <= 1 %.

Run from the repository root:  python benchmarks/bench_instrument.py
"""

from __future__ import annotations

import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import rankscope as rs
from rankscope.instrumentation import INSTRUMENTORS

ROUNDS = 12
STEPS = 60
TORCH = [name for name in INSTRUMENTORS if name.startswith("torch_")]


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


def make_trainer() -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.utils.data.DataLoader]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = torch.utils.data.TensorDataset(torch.randn(64 * STEPS, 512), torch.randn(64 * STEPS, 512))
    return model, optimizer, torch.utils.data.DataLoader(data, batch_size=64)


def run(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: Any, first: int) -> list[float]:
    times = []
    for step, (x, y) in enumerate(loader, start=first):
        start = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        dist.all_reduce(loss.detach())
        rs.flush(step)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    sink, endpoint = start_sink()
    try:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        rs.init(experiment=f"bench-instrument-{os.getpid()}", endpoint=endpoint)
        model, optimizer, loader = make_trainer()
        instrumentors = [INSTRUMENTORS[name]() for name in TORCH]
        run(model, optimizer, loader, 0)  # warm-up
        medians: dict[bool, list[float]] = {False: [], True: []}
        step = STEPS
        for _ in range(ROUNDS):
            for instrumented in (False, True):
                for instrumentor in instrumentors:
                    if instrumented:
                        instrumentor.instrument()
                    elif instrumentor.is_instrumented_by_opentelemetry:
                        instrumentor.uninstrument()
                # The DataLoader iterator's wait is inside the step loop: time whole iterations.
                start = time.perf_counter()
                run(model, optimizer, loader, step)
                medians[instrumented].append((time.perf_counter() - start) / STEPS)
                step += STEPS
        for instrumentor in instrumentors:
            instrumentor.uninstrument()
        rs.shutdown()
    finally:
        sink.terminate()
        sink.wait(10)
    off, on = statistics.median(medians[False]), statistics.median(medians[True])
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}")
    print(f"instrumentors: {', '.join(TORCH)} (grad norm off)")
    print(f"training step, uninstrumented: {off * 1e3:.2f} ms (median of {ROUNDS} rounds of {STEPS} steps)")
    print(f"training step, instrumented:   {on * 1e3:.2f} ms")
    print(f"overhead: {100 * (on - off) / off:+.2f} %  (budget <= 1 %)")


if __name__ == "__main__":
    main()
