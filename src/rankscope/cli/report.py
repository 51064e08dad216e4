"""``rankscope report``: an experiment's report page, from its data file or by asking its sink."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from ..core.settings import resolve
from .sink import find_sink, the_experiment


def add_parser(commands: Any) -> None:
    r = commands.add_parser("report", help="write an experiment's report: one self-contained HTML page")
    r.add_argument(
        "data",
        nargs="?",
        help="the report view's data file (report.jsonl) or its directory; an experiment's directory "
        "(its runs' directories in it): a page comparing its runs, compare.html",
    )
    r.add_argument("-o", "--output", help="the page (default: report.html beside the data file)")
    r.add_argument(
        "--spans",
        nargs="+",
        help="JSONL span files: add the Gantt of --steps (default: the last 3) to one run's page (its "
        "directory or report.jsonl; not an experiment's directory, whose runs are compared)",
    )
    r.add_argument("--steps", help="steps for the Gantt from --spans: 5 or 3,7 or 2-4")
    r.add_argument(
        "--sink",
        help="instead: ask this sink (HTTP URL) to write the experiment's page now (with no data and no "
        "--sink: the newest `rankscope run` or embedded sink on this machine)",
    )
    r.add_argument(
        "--experiment", help="experiment id for --sink (default RANKSCOPE_EXPERIMENT, else the sink's only one)"
    )
    r.add_argument("--run", help="run of the experiment for --sink (default: its latest)")
    r.add_argument("--token", help="bearer token of the sink (RANKSCOPE_SINK_TOKEN)")
    r.set_defaults(fn=command)


def command(args: argparse.Namespace) -> int:
    """Write an experiment's report page: from its report data file, or by asking its sink."""
    if args.data and args.sink:
        print("rankscope report: give the report data (a directory or report.jsonl), or --sink URL", file=sys.stderr)
        return 2
    gantt = [flag for flag, given in (("--spans", args.spans), ("--steps", args.steps)) if given]
    if args.steps and not args.spans:
        print(
            "rankscope report: --steps chooses the steps of the Gantt from --spans FILE...: give --spans",
            file=sys.stderr,
        )
        return 2
    flags, verb = " and ".join(gantt), "apply" if len(gantt) > 1 else "applies"
    if not args.data:  # a running sink: --sink, else the one on this machine
        if gantt:
            print(
                f"rankscope report: {flags} {verb} to a page written here from one run's report.jsonl, not to a "
                "sink's page: give the run's directory or its report.jsonl",
                file=sys.stderr,
            )
            return 2
        return _report_from_sink(args)
    from ..report import page, summary
    from ..sink.book.traces import parse_ranks

    data = Path(args.data)
    if data.is_dir() and not (data / "report.jsonl").exists():
        if gantt and page.run_dirs(data):  # the comparison draws no Gantt: said, never ignored
            print(
                f"rankscope report: {data} is an experiment's directory (its runs are compared, with no Gantt); "
                f"{flags} {verb} to one run's page: give that run's directory or its report.jsonl, "
                f"e.g. rankscope report {data / 'RUN'} {' '.join(gantt)} ...",
                file=sys.stderr,
            )
            return 2
        return _compare_runs(data, args)
    data = data / "report.jsonl" if data.is_dir() else data
    out_path = Path(args.output) if args.output else data.with_suffix(".html")
    if out_path.resolve() == data.resolve():
        print(f"rankscope report: {data} would be written over; give the report.jsonl beside it", file=sys.stderr)
        return 2
    try:
        found = summary.read(data)
        if found.experiment is None and not found.steps:
            print(f"rankscope report: {data} holds no report data (the report view's report.jsonl)", file=sys.stderr)
            return 1
        if args.spans:
            steps = parse_ranks(args.steps) if args.steps else None
            _add_gantt(found, args.spans, steps)
        out = page.write(found, out_path)
    except (OSError, ValueError) as exc:
        print(f"rankscope report: {exc}", file=sys.stderr)
        return 1
    size = out.stat().st_size / 1e6
    print(f"rankscope report: {found.steps} steps of {found.experiment!r} -> {out} ({size:.1f} MB)", file=sys.stderr)
    return 0


def _compare_runs(directory: Path, args: argparse.Namespace) -> int:
    """An experiment's directory (its runs' directories in it): the page that compares them."""
    from ..report import compare, page

    runs = page.run_dirs(directory)
    if not runs:
        print(f"rankscope report: {directory} holds no report.jsonl, nor run directories with one", file=sys.stderr)
        return 1
    try:
        out = compare.write_comparison(runs, Path(args.output) if args.output else directory / "compare.html")
    except (OSError, ValueError) as exc:
        print(f"rankscope report: {exc}", file=sys.stderr)
        return 1
    print(f"rankscope report: {len(runs)} runs of {directory} compared -> {out}", file=sys.stderr)
    return 0


def _add_gantt(found: Any, files: list[str], steps: set[int] | None) -> None:
    """The Gantt of chosen steps (default: the last three) from JSONL span files."""
    from ..report import perfetto
    from ..report.summary import gantt_spans, span_seconds

    by_step: dict[int, list[dict[str, Any]]] = {}
    for row in perfetto.read_jsonl(files):
        step = row.get("step")
        if isinstance(step, int) and (steps is None or step in steps):
            by_step.setdefault(step, []).append(row)
    chosen = sorted(by_step)[-3:] if steps is None else sorted(by_step)[:8]
    for step in chosen:
        bars, more = gantt_spans(by_step[step])
        ms = span_seconds(bars)
        found.add({"kind": "gantt", "why": f"step {step}", "step": step, "ms": ms, "spans": bars, "more": more})


def _report_from_sink(args: argparse.Namespace) -> int:
    from ..export.senders import request_report

    url = find_sink(args.sink)
    if args.token:
        os.environ["RANKSCOPE_SINK_TOKEN"] = args.token
    token = os.environ.get("RANKSCOPE_SINK_TOKEN")
    try:
        experiment = args.experiment or resolve("experiment") or the_experiment(url, token)
        paths = request_report(url, experiment, timeout=90.0, run=args.run)
    except (OSError, RuntimeError, LookupError) as exc:
        hint = "" if args.sink else "; give rankscope_logs/EXPERIMENT/ (all its runs), a run's directory, or --sink URL"
        print(f"rankscope report: {url}: {exc}{hint}", file=sys.stderr)
        return 1
    for path in paths:
        print(path)
    return 0
