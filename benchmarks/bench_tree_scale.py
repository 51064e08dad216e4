"""10,000 ranks x 200 keys as one experiment through agents -> gateway -> sink, every value
checked against what was sent; and how many ranks one sink takes without the tree.

The same parts as ``bench_tree.py`` (the built Collector running ``collector-config/agent.yaml``
and ``gateway.yaml``, ``rankscope sink`` writing a JSONL global view, one sender process replaying
OTLP requests encoded beforehand by rankscope's own encoder), at a scale this box can carry:

1. the tree: ``--ranks`` simulated ranks at one step per ``--period`` seconds. One agent per node
   of 8 ranks would be 1,250 Collectors; on 2 cores the ranks are grouped instead: ``--agents``
   agents, each taking a contiguous share of the ranks as its "node" (``--agents RANKS/8`` at
   fewer ranks measures real nodes). Each rank's values differ per step (``values``), so every
   step's reductions are new numbers.
2. at every step: each key's SUM/MEAN/MAX/MIN/STD and the rank holding each MAX (MIN) key's
   extreme (the view's ``{key}/argmax_rank``, ``argmin_rank``) equal to values computed here from
   the formula that generated the requests, not from any sink; ``rankscope/missing_processes``
   0; the sink's roster counts every rank (``ranks`` in its status: through the tree they close
   steps in merged rank sets, not as processes of their own). Measured over the steps after ``--warmup``: CPU seconds
   per step and peak RSS of the agents, the gateway, the sink and the sender (the load generator,
   standing in for the ranks).
3. the direct-to-sink limit (``--sweep``): the same kind of requests straight to one sink at
   ``--sweep-period`` (1 s), growing rank counts until the sink no longer keeps up: a step's
   requests not all acknowledged within the period, or its view written more than 1 s after its
   last request was acknowledged (the brief's step-view budget).
4. a projection, kept apart from the measured figures: the cores each tier needs for
   ``--ranks`` ranks at 1 step/s, from the measured CPU seconds per step.

Exits 1 when any value, roster or missing-process check fails. Run from the repository root:
  python benchmarks/bench_tree_scale.py --ranks 10000 --keys 200 --agents 10 --steps 6 --period 10
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import multiprocessing
import os
import platform
import resource
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench_tree import REDUCES, ROOT, Pipeline, cpu_seconds, status, template

LATENCY_BUDGET_S = 1.0  # a step's global view within 1 s of the last process reporting it (BRIEF.md)
CHUNK = 500  # ranks encoded per task of the encoding pool
MASK32 = np.uint64(0xFFFFFFFF)


def values(ranks: int, keys: int, step: int) -> np.ndarray:
    """Every value sent at ``step``, as ``[rank, key, i]`` (two per rank and key): a 32-bit mix of
    (rank, i, key, step) cut to 16 bits and divided by 4. Quarters below 16,384 are dyadic, and the
    sums of a million ranks' values and of their squares stay within 53 bits, so every sum is exact
    in any order, whatever the tree merges first. The mix moves the extremes and their holders per
    step, and ties at an extreme happen (about one MAX key in six at 10,000 ranks)."""
    r = np.arange(ranks, dtype=np.uint64)[:, None, None]
    k = np.arange(keys, dtype=np.uint64)[None, :, None]
    i = np.arange(2, dtype=np.uint64)[None, None, :]
    x = ((np.uint64(2) * r + i) * np.uint64(0x9E3779B1) + k * np.uint64(0x85EBCA77)) & MASK32
    x = (x + np.uint64(step) * np.uint64(0xC2B2AE3D)) & MASK32
    x ^= x >> np.uint64(15)
    x = (x * np.uint64(0x2C1B3C6D)) & MASK32
    x ^= x >> np.uint64(12)
    quarters: np.ndarray = (x >> np.uint64(16)).astype(np.float64) / 4
    return quarters


def expected(ranks: int, keys: int, step: int) -> dict[str, float]:
    """The step's global view, from the values sent: population STD from the exact sums (as the
    reduce type defines it); an extreme's holder is the lowest rank holding it (the sink's rule)."""
    v = values(ranks, keys, step)
    n = ranks * 2
    out: dict[str, float] = {}
    for k in range(keys):
        key, x, reduce = f"k{k:03d}", v[:, k, :], REDUCES[k % len(REDUCES)]
        if reduce == "sum":
            out[key] = float(x.sum())
        elif reduce == "mean":
            out[key] = float(x.sum()) / n
        elif reduce == "std":
            mean = float(x.sum()) / n
            variance = float((x * x).sum()) / n - mean * mean
            out[key] = math.sqrt(variance) if variance > 0 else 0.0
        elif reduce == "max":
            per_rank = x.max(axis=1)
            out[key], out[f"{key}/argmax_rank"] = float(per_rank.max()), float(per_rank.argmax())
        else:
            per_rank = x.min(axis=1)
            out[key], out[f"{key}/argmin_rank"] = float(per_rank.min()), float(per_rank.argmin())
    return out


def encode_chunk(job: tuple[int, int, str, int, int, int]) -> list[bytes]:
    """Requests of ranks [lo, hi) at one step (a task of the sender's encoding pool)."""
    ranks, keys, experiment, step, lo, hi = job
    v = values(ranks, keys, step)
    return [template(r, ranks, keys, experiment, step, v[r].tolist()) for r in range(lo, hi)]


def emit(**line: Any) -> None:
    print(json.dumps(line), flush=True)


def sender_main(spec: dict[str, Any]) -> None:
    """The load generator: encode every step's requests first (on every core), then send one step
    per period, each rank's request to the agent of its contiguous share, and say what it did."""
    ranks, keys, steps = spec["ranks"], spec["keys"], spec["steps"]
    jobs = [
        (ranks, keys, spec["experiment"], s, lo, min(lo + CHUNK, ranks))
        for s in range(steps)
        for lo in range(0, ranks, CHUNK)
    ]
    started = time.perf_counter()
    if ranks * steps > 4 * CHUNK:
        with ProcessPoolExecutor(os.cpu_count(), mp_context=multiprocessing.get_context("spawn")) as pool:
            chunks = list(pool.map(encode_chunk, jobs))
    else:
        chunks = [encode_chunk(job) for job in jobs]
    per_step = len(chunks) // steps
    bodies = [[b for c in chunks[s * per_step : (s + 1) * per_step] for b in c] for s in range(steps)]
    del chunks
    emit(ready=True, bytes_per_request=len(bodies[0][0]), encode_s=time.perf_counter() - started)
    asyncio.run(_send(spec, bodies))


async def _send(spec: dict[str, Any], bodies: list[list[bytes]]) -> None:
    import grpc

    channels = [grpc.aio.insecure_channel(e) for e in spec["endpoints"]]
    method = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
    calls = [c.unary_unary(method) for c in channels]
    share = -(-spec["ranks"] // len(calls))
    start, cpu0 = time.time() + 0.5, time.process_time()
    for step, requests in enumerate(bodies):
        await asyncio.sleep(max(0.0, start + step * spec["period"] - time.time()))
        if step == spec["warmup"]:
            cpu0 = time.process_time()
        sent = time.time()
        emit(start=step, time=sent)
        await asyncio.gather(*(calls[r // share](body, timeout=120) for r, body in enumerate(requests)))
        emit(step=step, scheduled=start + step * spec["period"], sent=sent, acked=time.time())
    cpu = time.process_time() - cpu0
    for c in channels:
        await c.close()
    emit(cpu=cpu, peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return math.nan


@dataclass
class Measured:
    """One run: what the sender did, what the view says, and what each tier cost."""

    name: str
    ranks: int
    keys: int
    steps: int
    warmup: int
    period: float
    request_bytes: int = 0
    encode_s: float = 0.0
    report: list[dict[str, float]] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)  # CPU s over the measured steps
    rss: dict[str, float] = field(default_factory=dict)  # peak MB (agents: the largest one)
    rows: dict[int, dict[str, list[Any]]] = field(default_factory=dict)  # {step: {key: [row, ...]}}
    status: dict[str, Any] = field(default_factory=dict)

    @property
    def measured_steps(self) -> int:
        return self.steps - self.warmup

    def per_step(self, tier: str) -> float:
        return self.cpu[tier] / self.measured_steps

    def latency(self, step: int) -> float:
        """Seconds from the step's last acknowledged request to its global view."""
        first = min(r["time"] for rows in self.rows.get(step, {}).values() for r in rows)
        return float(first - self.report[step]["acked"])

    def behind(self) -> float:
        """How far the slowest measured step's requests were acknowledged past the end of its period."""
        return max(r["acked"] - r["scheduled"] - self.period for r in self.report[self.warmup :])


def tiers_cpu(tiers: dict[str, list[subprocess.Popen[Any]]]) -> dict[str, float]:
    return {t: sum(cpu_seconds(p.pid) for p in ps) for t, ps in tiers.items()}


def drive(
    pipeline: Pipeline, run: Measured, endpoints: list[str], tiers: dict[str, list[subprocess.Popen[Any]]], http: int
) -> Measured:
    """Send ``run``'s steps through ``endpoints`` and wait for the sink's view of every step,
    printing a status line per step; CPU is counted from the first measured step's start to the
    last step's view."""
    spec = {
        "ranks": run.ranks,
        "keys": run.keys,
        "steps": run.steps,
        "warmup": run.warmup,
        "period": run.period,
        "experiment": run.name,
        "endpoints": endpoints,
    }
    code = "import json, sys; import bench_tree_scale as b; b.sender_main(json.loads(sys.argv[1]))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "benchmarks")])}
    sender = subprocess.Popen(
        [sys.executable, "-c", code, json.dumps(spec)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    pipeline.procs.append(sender)
    print(f"  [{run.name}] encoding {run.ranks * run.steps:,} requests ...", flush=True)
    began, before = time.monotonic(), tiers_cpu(tiers)
    assert sender.stdout is not None
    for text in sender.stdout:
        line = json.loads(text)
        if "ready" in line:
            run.request_bytes, run.encode_s = line["bytes_per_request"], line["encode_s"]
            print(
                f"  [{run.name}] {run.request_bytes:,} bytes per request, encoded in {run.encode_s:.0f} s", flush=True
            )
        elif "start" in line and line["start"] == run.warmup:
            before = tiers_cpu(tiers)
        elif "step" in line:
            run.report.append(line)
            print(
                f"  [{run.name} {time.monotonic() - began:5.0f} s] step {line['step'] + 1}/{run.steps} acknowledged "
                f"in {line['acked'] - line['sent']:.1f} s; "
                f"sink wrote step {status(http, run.name).get('last_written_step')}",
                flush=True,
            )
        elif "cpu" in line:
            run.cpu["sender"], run.rss["sender"] = line["cpu"], line["peak_rss_mb"]
    if sender.wait(60) != 0 or len(run.report) != run.steps:
        raise SystemExit(f"{run.name}: the sender failed (exit {sender.returncode}, {len(run.report)} steps sent)")
    deadline, shown = time.monotonic() + 120 + run.steps * run.period, time.monotonic()
    while (last := status(http, run.name).get("last_written_step", -1)) < run.steps - 1 and time.monotonic() < deadline:
        if time.monotonic() - shown > 10:
            print(
                f"  [{run.name} {time.monotonic() - began:5.0f} s] waiting for the view: sink wrote step {last}",
                flush=True,
            )
            shown = time.monotonic()
        time.sleep(0.25)
    run.cpu.update({t: c - before[t] for t, c in tiers_cpu(tiers).items()})
    run.rss.update({t: max(peak_rss_mb(p.pid) for p in ps) for t, ps in tiers.items()})
    run.status = status(http, run.name)
    for text in (pipeline.tmp / f"{run.name}.jsonl").read_text().splitlines():
        row = json.loads(text)
        if row["kind"] == "global_reduce":
            run.rows.setdefault(row["step"], {}).setdefault(row["key"], []).append(row)
    return run


def check(run: Measured, show: bool) -> list[str]:
    """Failures: a step's view unwritten, a value (any row of it, a late update too) unequal to
    the formula's, a process missing, the roster short of the ranks. Prints a line per step."""
    failures = []
    for step in range(run.steps):
        got, want = run.rows.get(step, {}), expected(run.ranks, run.keys, step)
        if not got:
            failures.append(f"{run.name}: step {step} was never written")
            continue
        wrong = [k for k, v in want.items() if [r["value"] for r in got.get(k, [])] != [v]]
        missing = [r["value"] for r in got.get("rankscope/missing_processes", [])]
        if wrong:
            shown = "; ".join(f"{k} = {[r['value'] for r in got.get(k, [])]}, sent {want[k]}" for k in wrong[:3])
            failures.append(f"{run.name} step {step}: {len(wrong)} values differ from those sent, e.g. {shown}")
        if missing != [0]:
            failures.append(f"{run.name} step {step}: rankscope/missing_processes {missing}")
        if show:
            holders = sum(k.endswith("_rank") for k in want)
            verdict = "exact" if not wrong else f"{len(wrong)} WRONG"
            print(
                f"    step {step}: {run.keys} keys' sum/mean/max/min/std and {holders} extremes' ranks {verdict}; "
                f"missing_processes {missing}; view {run.latency(step):.2f} s after the last request's ack"
            )
    if run.status.get("ranks") != run.ranks:
        failures.append(f"{run.name}: the sink's roster has {run.status.get('ranks')} ranks, sent {run.ranks}")
    return failures


def tree(otelcol: str, args: argparse.Namespace, tmp: Path) -> tuple[Measured, list[str]]:
    pipeline = Pipeline(tmp)
    try:
        sink, grpc, http = pipeline.sink("tree")
        gateway, endpoint = pipeline.collector(otelcol, "gateway", "gateway", SINK_HOSTNAMES=f"[127.0.0.1:{grpc}]")
        agents = [
            pipeline.collector(otelcol, "agent", f"agent{i}", GATEWAY_HOSTNAMES=f"[{endpoint}]")
            for i in range(args.agents)
        ]
        run = Measured("tree", args.ranks, args.keys, args.steps, args.warmup, args.period)
        tiers = {"agents": [p for p, _ in agents], "gateway": [gateway], "sink": [sink]}
        drive(pipeline, run, [e for _, e in agents], tiers, http)
    finally:
        pipeline.stop()
    failures = check(run, show=True)
    share = -(-args.ranks // args.agents)
    rate = 1 / args.period
    print(f"\n  MEASURED: {args.ranks:,} ranks x {args.keys} keys = {args.ranks * args.keys:,} states per step")
    print(f"    {args.agents} agents of {share:,} contiguous ranks each (a 'node') -> 1 gateway -> 1 sink, on this box")
    print(
        f"    steps: {args.steps} at {rate:g} step/s, the first {args.warmup} not measured; "
        f"{run.request_bytes:,} bytes per request"
    )
    print(
        f"    sink: {run.status.get('ranks'):,} ranks in the roster ({run.status.get('processes'):,} processes of "
        f"their own), {run.status.get('merge_upstreams')} merge upstreams, "
        f"{run.status.get('points', 0) / args.steps:,.0f} points/step received"
    )
    latencies = [run.latency(s) for s in range(args.steps) if s in run.rows]
    print(f"    step view after the last ack: max {max(latencies, default=math.nan):.2f} s; period {args.period:g} s")
    print(f"    {'tier':<36}{'CPU s/step':>12}{'cores at ' + format(rate, 'g') + ' step/s':>22}{'peak RSS MB':>14}")
    for tier, label in (
        ("agents", f"agents (all {args.agents}; RSS: largest)"),
        ("gateway", "gateway"),
        ("sink", "sink"),
        ("sender", "sender (load generator)"),
    ):
        rss = f"{run.rss[tier]:,.0f}"
        print(f"    {label:<36}{run.per_step(tier):>12.2f}{run.per_step(tier) * rate:>22.2f}{rss:>14}")
    print(
        f"\n  PROJECTED (not measured): {args.ranks:,} ranks x {args.keys} keys at 1 step/s, "
        "cores per tier = CPU s/step x 1"
    )
    for tier in ("agents", "gateway", "sink"):
        print(f"    {tier:<10} {run.per_step(tier):6.2f} cores -> {math.ceil(run.per_step(tier)):d}")
    print(
        f"    (agents of {share:,} ranks each; agents of one 8-rank node each cost more per state and send the "
        f"gateway more merged states: measure that grouping with --agents {math.ceil(args.ranks / 8)} at fewer ranks)"
    )
    return run, failures


def sweep(otelcol: str, args: argparse.Namespace, tmp: Path) -> tuple[list[tuple[Measured, bool]], list[str]]:
    """Ranks straight to one sink at ``--sweep-period``, up the list until one does not keep up."""
    done: list[tuple[Measured, bool]] = []
    failures: list[str] = []
    print(f"\n  DIRECT TO ONE SINK, {args.keys} keys at {1 / args.sweep_period:g} step/s (measured)")
    for ranks in args.sweep:
        pipeline = Pipeline(tmp / f"direct-{ranks}")
        pipeline.tmp.mkdir()
        run = Measured(f"direct{ranks}", ranks, args.keys, args.sweep_steps, 1, args.sweep_period)
        try:
            sink, grpc, http = pipeline.sink(run.name)
            drive(pipeline, run, [f"127.0.0.1:{grpc}"], {"sink": [sink]}, http)
        finally:
            pipeline.stop()
        failures += check(run, show=False)
        latency = max((run.latency(s) for s in range(run.steps) if s in run.rows), default=math.inf)
        keeps_up = run.behind() <= 0 and latency <= LATENCY_BUDGET_S
        done.append((run, keeps_up))
        print(
            f"    {ranks:>6,} ranks ({ranks * args.keys:>9,} points/step): sink CPU {run.per_step('sink'):.2f} s/step, "
            f"sender CPU {run.per_step('sender'):.2f} s/step, "
            f"requests acknowledged {run.behind():+.2f} s past the period, "
            f"view max {latency:.2f} s after the last ack: {'keeps up' if keeps_up else 'DOES NOT keep up'}",
            flush=True,
        )
        if not keeps_up:
            break
    kept = [r.ranks for r, ok in done if ok]
    short = [r.ranks for r, ok in done if not ok]
    if kept:
        print(
            f"    limit: one sink keeps up with {max(kept):,} ranks x {args.keys} keys "
            f"({max(kept) * args.keys / args.sweep_period:,.0f} points/s)"
            + (f", not with {short[0]:,}" if short else f"; every size tried kept up (none beyond {max(kept):,} tried)")
        )
    elif short:
        print(f"    limit: one sink does not keep up even with {short[0]:,} ranks x {args.keys} keys")
    return done, failures


def machine() -> str:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return f"{platform.platform()}, {model}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def load() -> str:
    """The box's load average: other work on it stretches latencies (CPU seconds much less)."""
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()) + " (1, 5, 15 min)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=10_000)
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--agents", type=int, default=10, help="agents, each a contiguous share of the ranks")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=1, help="first steps left out of the CPU figures")
    parser.add_argument("--period", type=float, default=10.0, help="seconds per step through the tree")
    parser.add_argument(
        "--sweep",
        type=lambda s: [int(x) for x in s.split(",") if x],
        default=[256, 320, 384, 448, 512, 640, 768, 1024],
        help="rank counts sent straight to one sink, up to the first that does not keep up ('': none)",
    )
    parser.add_argument("--tree", action=argparse.BooleanOptionalAction, default=True, help="run the tree")
    parser.add_argument("--sweep-steps", type=int, default=8)
    parser.add_argument("--sweep-period", type=float, default=1.0)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds through each pipeline's stop()
    if not 0 <= args.warmup < args.steps or args.sweep_steps < 2:
        parser.error("--warmup must leave a measured step, and --sweep-steps be at least 2")
    built = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build_pipeline.py")], capture_output=True, text=True, check=True
    )
    otelcol = json.loads(built.stdout.strip().splitlines()[-1])["otelcol"]
    print(f"bench_tree_scale: {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}; {machine()}")
    print(f"  {load()}", flush=True)
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="rankscope-bench-tree-scale-") as work:
        if args.tree:
            failures += tree(otelcol, args, Path(work))[1]
            print(f"  {load()}")
        if args.sweep:
            failures += sweep(otelcol, args, Path(work))[1]
            print(f"  {load()}")
    for failure in failures[:20]:
        print(f"  FAILED: {failure}")
    print(f"bench_tree_scale: {'FAIL' if failures else 'PASS'} ({len(failures)} failed checks)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
