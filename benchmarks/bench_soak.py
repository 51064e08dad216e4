"""A long run held flat: a sink's memory, file handles and threads over 100,000 steps.

One experiment of 64 processes x 8 keys (mean, sum, max, min and std, encoded by rankscope's own
encoder: ``bench_tree.template``) goes into a started sink in this process, one request of all
64 processes per step, parsed from bytes as the transports parse it (no socket: the soak measures
the sink, not the loopback). The sink keeps a write-ahead log and writes the JSONL and report
views, as a long job's sink does. Every ``--every`` steps, once the views wrote everything so
far, it samples the process's resident memory, open file descriptors, threads, the report view's
data file and the write-ahead log's size on disk. The baseline is the first sample, measured
in the same run (after the warm-up of the first ``--every`` steps); each later sample is printed
with its difference from it. Flat is: the same threads and file descriptors at every sample,
memory within a few MB, the report's data and the log bounded.

Run from the repository root:  python benchmarks/bench_soak.py [--steps 100000 --every 10000]
``tests/integration/test_soak.py`` runs a short version (2,000 steps) in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_tree import for_step, template  # noqa: E402
from rankscope.otlp.raw import parse_metrics  # noqa: E402
from rankscope.sink import (  # noqa: E402
    BookConfig,
    Sink,
    SinkConfig,
)

EXPERIMENT = "soak"


@dataclass
class Sample:
    step: int
    seconds: float
    rss_mb: float
    fds: int
    threads: int
    report_data_kb: float
    wal_kb: float
    jsonl_rows: int


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _size_kb(root: Path, pattern: str) -> float:
    return sum(p.stat().st_size for p in root.rglob(pattern) if p.is_file()) / 1024


def soak(steps: int, every: int, processes: int, keys: int, root: Path, compact_bytes: int = 4 << 20) -> list[Sample]:
    """Drive ``steps`` steps through a sink under ``root``; a sample every ``every`` steps
    (``compact_bytes``: the report view's, smaller for a short run to compact too)."""
    views = root / "views"
    jsonl = views / "global.jsonl"
    config = SinkConfig(
        grpc_port=None,
        http_port=None,
        state_dir=root / "state",
        backends={
            "jsonl": {"logging_mode": "global_reduce", "path": str(jsonl)},
            "report": {"path": str(views / "report.html"), "compact_bytes": compact_bytes},
        },
        book=BookConfig(grace=60.0, step_window=1 << 62),
    )
    body = b"".join(template(rank, processes, keys, EXPERIMENT) for rank in range(processes))
    points = processes * (keys + 1)
    samples: list[Sample] = []
    rows = 0
    start = time.perf_counter()
    with Sink(config) as sink:
        for step in range(steps):
            result = sink.export_metrics(parse_metrics(for_step(body, step, points)))
            assert result.rejected == 0, result.message
            if (step + 1) % every == 0:
                sink.finalize(EXPERIMENT)  # the finalizer would, within its tick: settle before sampling
                assert sink.wait_written(EXPERIMENT, timeout=600)
                with jsonl.open() as f:
                    rows = sum(1 for _ in f)
                samples.append(
                    Sample(
                        step=step + 1,
                        seconds=round(time.perf_counter() - start, 1),
                        rss_mb=round(_rss_mb(), 1),
                        fds=len(os.listdir("/proc/self/fd")),
                        threads=threading.active_count(),
                        report_data_kb=round(_size_kb(views, "*.jsonl") - jsonl.stat().st_size / 1024, 1),
                        wal_kb=round(_size_kb(root / "state", "*"), 1),
                        jsonl_rows=rows,
                    )
                )
                print(_line(samples[0], samples[-1]), flush=True)
    return samples


def _line(base: Sample, now: Sample) -> str:
    return (
        f"step {now.step:>7,}  {now.seconds:>7.1f}s  rss {now.rss_mb:7.1f} MB ({now.rss_mb - base.rss_mb:+.1f})  "
        f"fds {now.fds} ({now.fds - base.fds:+d})  threads {now.threads} ({now.threads - base.threads:+d})  "
        f"report data {now.report_data_kb:,.0f} KB ({now.report_data_kb / max(base.report_data_kb, 1):.2f}x)  "
        f"wal {now.wal_kb:,.0f} KB"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--every", type=int, default=10_000)
    parser.add_argument("--processes", type=int, default=64)
    parser.add_argument("--keys", type=int, default=8)
    parser.add_argument("--json", type=Path, help="also write the samples here")
    args = parser.parse_args()
    print(
        f"soak: {args.processes} processes x {args.keys} keys, {args.steps:,} steps, a sample every {args.every:,}; "
        f"{platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="rankscope-soak-") as tmp:
        samples = soak(args.steps, args.every, args.processes, args.keys, Path(tmp))
    base, last = samples[0], samples[-1]
    report = last.report_data_kb / max(base.report_data_kb, 1)
    print(
        f"last vs first sample: rss {last.rss_mb - base.rss_mb:+.1f} MB, fds {last.fds - base.fds:+d}, "
        f"threads {last.threads - base.threads:+d}, report data {report:.2f}x; "
        f"{args.steps * args.processes * (args.keys + 1) / last.seconds:,.0f} points/s through the sink"
    )
    if args.json:
        args.json.write_text(json.dumps([asdict(s) for s in samples], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
