"""What a short torchrun job pays for rankscope, start to exit (issue 53): the fixed cost.

``examples/mytrain.py`` (2 gloo ranks, a traced step, two keys, an all-reduce) for ``--steps``
steps under ``torchrun --standalone --nproc_per_node=2``, two arms, each in a fresh torchrun,
alternately:

- ``off``: ``RANKSCOPE_DISABLE=1``: every rankscope call a no-op (the baseline: torch, torchrun,
  the script);
- ``on``: nothing configured: the embedded sink starts, prints a line per step, keeps the run
  (report and JSONL) and says ``report: PATH`` at the end.

Per run: the wall time of the whole command, and, with rankscope on, the seconds from its last
step line to the command's end (what a user waits for after the last line). Per arm the median and
range of ``--rounds``; the difference is rankscope's fixed cost.

Run from the repository root:  python benchmarks/bench_short_job.py [--steps 3 --rounds 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(arm: str, steps: int) -> tuple[float, float | None]:
    """(wall seconds, seconds from the last step line to the end) of one launch."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "OTEL_"))}
    env["OMP_NUM_THREADS"] = "1"
    if arm == "off":
        env["RANKSCOPE_DISABLE"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += [str(ROOT / "examples" / "mytrain.py"), "--steps", str(steps)]
    with tempfile.TemporaryDirectory(prefix="bench-short-") as cwd:
        env["RANKSCOPE_RUNTIME_DIR"] = cwd
        started = time.monotonic()
        last_step = None
        with subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        ) as job:
            assert job.stdout is not None
            for line in job.stdout:  # until EOF: the embedded sink holds the pipe until it exits
                if re.match(r"step \d+  ", line):
                    last_step = time.monotonic()
            code = job.wait(timeout=300)
        ended = time.monotonic()
    if code != 0:
        raise SystemExit(f"{arm}: torchrun exited {code}")
    if arm == "on" and last_step is None:
        raise SystemExit("on: no step line printed")
    return ended - started, None if last_step is None else ended - last_step


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    walls: dict[str, list[float]] = {"off": [], "on": []}
    tails: list[float] = []
    for i in range(args.rounds):
        for arm in ("off", "on") if i % 2 == 0 else ("on", "off"):
            wall, tail = run(arm, args.steps)
            walls[arm].append(wall)
            if tail is not None:
                tails.append(tail)
        print(f"round {i + 1}/{args.rounds}: off {walls['off'][-1]:.2f} s, on {walls['on'][-1]:.2f} s", flush=True)
    off, on = statistics.median(walls["off"]), statistics.median(walls["on"])
    print(f"{platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, {args.steps} steps")
    print(f"rankscope off (RANKSCOPE_DISABLE=1): {spread(walls['off'])}")
    print(f"rankscope on (nothing configured):   {spread(walls['on'])}  ratio {on / off:.2f}x, +{on - off:.2f} s")
    print(f"last step line to exit:             {spread(tails)}")


if __name__ == "__main__":
    main()
