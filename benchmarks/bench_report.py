"""What the report view costs a sink per step, next to the bare decode of that step's data.

One step of 1,024 simulated ranks x 200 keys: the report view's ``log_batch`` with every
process's values (the spread), the phase times of 4 phases (the heat map) and 4 spans per
process (the Gantt candidates), as the sink's views thread calls it; against, as the baseline
measured in the same run, a bare decode-and-walk of that step's 1,024 OTLP requests (encoded by
rankscope's encoder: ``bench_tree.template``), the least any sink pays to read the step. Each
round runs in a fresh child process, the two measured alternately; median and range of rounds.
Then the page: writing it (``report.page.write``) after ``--steps`` steps.

Run from the repository root:  python benchmarks/bench_report.py [--ranks 1024 --keys 200 --rounds 5]
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
from dataclasses import dataclass
from pathlib import Path
sys.path.insert(0, "benchmarks")
from bench_sink import decode_and_walk
from bench_tree import for_step, template
from rankscope.backends.base import Metric
from rankscope.backends.report import ReportBackend
from rankscope.metrics.reduce import Reduce

ranks, keys, steps = (int(a) for a in sys.argv[1:4])


@dataclass(frozen=True)
class Process:  # what the sink hands views: label, role, replica, rank
    label: str
    role: str
    replica: str | None
    rank: int


processes = [Process(f"trainer_r{r}", "trainer", None, r) for r in range(ranks)]
bodies = [for_step(template(r, ranks, keys, "bench"), 1, keys + 1) for r in range(ranks)]


def step_kwargs(step):
    per_process = {
        p: [Metric(f"k{k:03d}", float((p.rank * 7 + k + step) % 16) / 4, Reduce.MEAN) for k in range(keys)]
        for p in processes
    }
    names = ("data", "fwd", "bwd", "opt")
    phases = {f"train/{n}": {p: 0.01 * (i + 1) + p.rank * 1e-6 for p in processes} for i, n in enumerate(names)}
    t0 = 10**18 + step * 10**9
    spans = [
        {"process": p.label, "role": "trainer", "rank": p.rank, "name": name, "start_ns": t0 + i * 10**7,
         "end_ns": t0 + (i + 1) * 10**7, "span_id": f"{p.rank:08x}{i:08x}", "parent_span_id": "", "attributes": {},
         "links": []}
        for p in processes for i, name in enumerate(phases)
    ]
    return {"per_process": per_process, "phase_times": phases, "spans": lambda: spans, "missing": []}


with tempfile.TemporaryDirectory() as out:
    view = ReportBackend({"path": str(Path(out) / "report.html")})
    view.init("global", experiment="bench")
    inputs = [step_kwargs(s) for s in range(steps)]
    values = [Metric(f"k{k:03d}", 1.0, Reduce.MEAN) for k in range(keys)]
    decode, report = [], []
    for step in range(steps):  # alternately: a slower second of the machine hits both
        t = time.perf_counter()
        decode_and_walk(bodies)
        decode.append(time.perf_counter() - t)
        t = time.perf_counter()
        view.log_batch(values, step, **inputs[step])
        report.append(time.perf_counter() - t)
    t = time.perf_counter()
    path = view.report({})
    page = time.perf_counter() - t
    print(json.dumps({"decode": sorted(decode)[len(decode) // 2], "report": sorted(report)[len(report) // 2],
                      "page": page, "bytes": Path(path).stat().st_size}))
"""


def spread(values: list[float], scale: float = 1000.0, unit: str = "ms") -> str:
    return f"{statistics.median(values) * scale:.1f} {unit} ({min(values) * scale:.1f}-{max(values) * scale:.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rounds = []
    for _ in range(args.rounds):
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(args.ranks), str(args.keys), str(args.steps)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(["src", os.environ.get("PYTHONPATH", "")])},
        )
        rounds.append(json.loads(done.stdout.strip().splitlines()[-1]))
    decode = [r["decode"] for r in rounds]
    report = [r["report"] for r in rounds]
    ratios = [r["report"] / r["decode"] for r in rounds]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(
        f"{args.ranks} ranks x {args.keys} keys, {args.steps} steps per round, {args.rounds} rounds (child processes)"
    )
    print(f"bare decode-and-walk of a step : {spread(decode)}")
    print(f"report view, one step          : {spread(report)} = {spread(ratios, 100, '%')} of the bare decode")
    pages = [r["page"] for r in rounds]
    size = statistics.median(r["bytes"] for r in rounds) / 1e6
    print(f"writing the page               : {spread(pages)}, {size:.1f} MB")


if __name__ == "__main__":
    main()
