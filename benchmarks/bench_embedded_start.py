"""The embedded sink's start on a busy box, many times over: does any rank lose data?

Runs the newcomer's ``torchrun --standalone --nproc_per_node=4 examples/spmd_torchrun.py``
``--runs`` times while CPU hogs (``--hogs``, default as many as cores) keep the box busy, and
checks every rank's values at every step (``lost``): the global view's ``tokens`` is 16 per rank
at every step, each rank's own view has its 16, no process dropped points, and the sink
finalized no step without a process. Rank 0 starts the embedded sink; it used to shut down
while its sink was starting or too busy to answer within ``RANKSCOPE_SHUTDOWN_TIMEOUT`` and drop
its last steps (1 run in 3 on a 2-core VM). Prints one line per run and a summary; exits 1 if
any run lost data.

Run from the repository root:  python benchmarks/bench_embedded_start.py [--runs 30 --hogs 2]
``tests/e2e/test_embedded_sink_load.py`` runs 4.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RANKS = 4


@contextmanager
def busy_box(hogs: int | None = None) -> Iterator[None]:
    """``hogs`` CPU hogs (default as many as cores), stopped (by pid) on the way out."""
    started = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
        for _ in range(hogs or os.cpu_count() or 2)
    ]
    try:
        yield
    finally:
        for hog in started:
            hog.kill()
        for hog in started:
            hog.wait(10)


def run_spmd_example(runtime_dir: Path, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """The newcomer's command, in its own session (killed as a group, and ``TimeoutError``, if it hangs)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "OTEL_", "TORCHELASTIC_"))}
    env["RANKSCOPE_RUNTIME_DIR"] = str(runtime_dir)  # these runs' embedded sinks only
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={RANKS}"]
    child = subprocess.Popen(
        [*cmd, "examples/spmd_torchrun.py"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        out, err = child.communicate()
        raise TimeoutError(f"the example did not end within {timeout:.0f}s:\n{err[-3000:]}") from None
    return subprocess.CompletedProcess(child.args, child.returncode, out, err)


def tokens_by_view(stdout: str) -> dict[tuple[str, int], float]:
    """``tokens`` (SUM: 16 per rank) of each view the sink printed: (view, step) -> value; the
    global view is ``GlobalReduce``. Reads the console's one line per step (``step 3  loss 2.141
    tokens 64``, ``[trainer_r1] step 3  ...``) and its per-key blocks (``=== [trainer_r1] - METRICS
    STEP 3 ===`` ... ``tokens: 16.0``)."""
    found: dict[tuple[str, int], float] = {}
    for line in re.finditer(r"^(?:\[(\w+)\] )?step (\d+)\b(.*)$", stdout, re.M):
        value = re.search(r"\btokens:? (\S+)", line.group(3))
        if value is not None:
            found[(line.group(1) or "GlobalReduce", int(line.group(2)))] = float(value.group(1))
    for block in re.finditer(r"=== \[(\w+)\] - METRICS STEP (\d+) ===\n(.*?)\n===============", stdout, re.S):
        value = re.search(r"^tokens: (\S+)$", block.group(3), re.M)
        if value is not None:
            found[(block.group(1), int(block.group(2)))] = float(value.group(1))
    return found


def lost(result: subprocess.CompletedProcess[str]) -> list[str]:
    """What one run lost, in words (empty: every rank's values at every step)."""
    problems = [f"exit code {result.returncode}"] if result.returncode else []
    problems += [line for line in result.stderr.splitlines() if "dropped" in line or "finalized without" in line]
    if "missing" in result.stdout:
        problems.append("the sink named a missing process")
    tokens = tokens_by_view(result.stdout)
    steps = 1 + max((step for _, step in tokens), default=-1)
    if steps < 3:  # the example's steps (a lost last step shows as a sum short of a rank)
        problems.append(f"{steps} steps printed")
    for step in range(steps):
        if tokens.get(("GlobalReduce", step)) != 16.0 * RANKS:
            problems.append(f"step {step}: global tokens {tokens.get(('GlobalReduce', step))}")
        problems += [
            f"step {step}: trainer_r{rank} {tokens.get((f'trainer_r{rank}', step))}"
            for rank in range(RANKS)
            if tokens.get((f"trainer_r{rank}", step)) != 16.0
        ]
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description="the embedded sink's start on a busy box, many times over")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    failed = 0
    began = time.monotonic()
    with busy_box(args.hogs), tempfile.TemporaryDirectory(prefix="rankscope-soak-") as tmp:
        for n in range(args.runs):
            started = time.monotonic()
            try:
                problems = lost(run_spmd_example(Path(tmp) / f"run{n}", timeout=300))
            except TimeoutError as exc:
                problems = [str(exc).splitlines()[0]]
            failed += bool(problems)
            verdict = "ok" if not problems else "LOST: " + "; ".join(problems[:4])
            print(f"run {n + 1}/{args.runs}: {time.monotonic() - started:.1f}s {verdict}", flush=True)
    print(f"{args.runs - failed}/{args.runs} runs clean, {args.hogs} hogs, {time.monotonic() - began:.0f}s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
