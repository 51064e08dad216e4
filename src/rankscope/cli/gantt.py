"""``rankscope gantt``: a Perfetto/Chrome trace file from a sink's spans or JSONL span files."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ..core.settings import resolve
from .sink import find_sink, the_experiment


def add_parser(commands: Any) -> None:
    g = commands.add_parser("gantt", help="write a Perfetto/Chrome trace file: one track per rank, per step")
    g.add_argument("files", nargs="*", help="JSONL span files (the sink's /rankscope/v1/spans format)")
    g.add_argument(
        "--sink",
        help="the sink's HTTP URL, e.g. http://127.0.0.1:4318 (with no files and no --sink: the newest "
        "`rankscope run` or embedded sink on this machine)",
    )
    g.add_argument(
        "--experiment",
        help="experiment id to read from the sink (default RANKSCOPE_EXPERIMENT, else the sink's only one)",
    )
    g.add_argument("--steps", help="step or range: 5, 2:8, 10:")
    g.add_argument("--ranks", help="rank subset: 0,2,4-7")
    g.add_argument("-o", "--output", default="trace.json", help="output file; .gz is gzipped (default trace.json)")
    g.add_argument("--gzip", action="store_true", help="gzip the output whatever its name")
    g.add_argument("--token", help="bearer token of the sink (RANKSCOPE_SINK_TOKEN)")
    g.set_defaults(fn=command)


def _steps(text: str | None) -> tuple[int | None, int | None]:
    """``"5"`` → (5, 5); ``"2:8"`` → (2, 8); ``"10:"`` → (10, None)."""
    if not text:
        return None, None
    low, sep, high = text.partition(":")
    first = int(low) if low.strip() else None
    return first, (int(high) if high.strip() else None) if sep else first


def command(args: argparse.Namespace) -> int:
    """Write a Perfetto/Chrome trace-event file from the sink's stored spans or JSONL span files."""
    from ..report import perfetto
    from ..sink.book.traces import parse_ranks

    if args.files and args.sink:
        print("rankscope gantt: give JSONL span files, or --sink URL", file=sys.stderr)
        return 2
    first, last = _steps(args.steps)
    keep = perfetto.Filter(first, last, parse_ranks(args.ranks))
    if not args.files:  # a running sink: --sink, else the one on this machine
        sink = find_sink(args.sink)
        token = args.token or os.environ.get("RANKSCOPE_SINK_TOKEN")
        try:
            experiment = args.experiment or resolve("experiment") or the_experiment(sink, token)
        except LookupError as exc:
            print(f"rankscope gantt: {exc}", file=sys.stderr)
            return 2
        rows = perfetto.read_sink(sink, experiment, keep, token)
    else:
        rows = perfetto.read_jsonl(args.files)
    try:
        written = perfetto.write(rows, args.output, keep, gz=True if args.gzip else None)
    except (OSError, ValueError) as exc:
        print(f"rankscope gantt: {exc}", file=sys.stderr)
        return 1
    print(
        f"rankscope gantt: {written.spans} spans of {written.processes} processes -> {args.output} "
        "(open in https://ui.perfetto.dev)",
        file=sys.stderr,
    )
    return 0
