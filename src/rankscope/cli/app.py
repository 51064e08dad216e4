"""The ``rankscope`` command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from ._version import __version__
from .core.settings import resolve, settings_markdown


def _identity(_: argparse.Namespace) -> int:
    from .core.identity import build_resource

    print(json.dumps(dict(build_resource().attributes), indent=2, sort_keys=True))
    return 0


def _settings(args: argparse.Namespace) -> int:
    print(settings_markdown())
    return 0


def _sink_config(args: argparse.Namespace) -> Any:
    from .sink import SinkConfig

    backends = json.loads(args.backends) if args.backends else None
    return SinkConfig(
        host=args.host,
        grpc_port=args.grpc_port,
        http_port=args.http_port,
        backends=backends,
        grace=args.grace if args.grace is not None else resolve("sink_grace"),
        token=args.token or os.environ.get("RANKSCOPE_SINK_TOKEN") or None,
        state_dir=None if args.no_state_dir or args.state_dir in (None, "") else Path(args.state_dir),
        spans_dir=Path(args.spans_dir) if args.spans_dir else None,
        max_span_file_bytes=args.max_span_file_bytes,
        time_bucket=args.time_bucket,
        view_workers=max(1, args.view_workers),
        resume_window=args.resume_window,
        report=args.report,
        trust_posted_paths=args.command == "run" or args.trust_posted_paths,
    )


def _sink(args: argparse.Namespace) -> int:
    from .sink import Sink
    from .sink.wal import StateDirBusyError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    config = _sink_config(args)
    try:
        sink = Sink(config).start()
    except (StateDirBusyError, OSError) as exc:
        print(f"rankscope sink: {exc}", file=sys.stderr)
        return 2
    durable = f"write-ahead log in {config.state_dir}" if config.state_dir else "no write-ahead log (--no-state-dir)"
    print(
        f"rankscope sink: OTLP/gRPC on {args.host}:{sink.grpc_port}, OTLP/HTTP on {args.host}:{sink.http_port}, "
        f"{durable}; status: http://{args.host}:{sink.http_port}/rankscope/v1/status",
        file=sys.stderr,
        flush=True,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    print("rankscope sink: stopping (finalizing open steps)", file=sys.stderr, flush=True)
    sink.stop()
    return 0


def _run(args: argparse.Namespace) -> int:
    """Start a sink, run the command with the experiment's environment, forward its exit code."""
    from .core.identity import detect_run, generate_experiment_id, generate_run_id
    from .sink import Sink

    command = args.command_line[1:] if args.command_line[:1] == ["--"] else args.command_line
    if not command:
        print("rankscope run: give a command, e.g. rankscope run -- python train.py", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("rankscope.sink").setLevel(logging.INFO)  # "new experiment ...: where its views write"
    args.grpc_port = args.grpc_port if args.grpc_port is not None else 0
    args.http_port = args.http_port if args.http_port is not None else 0
    spans_tmp = None
    if args.gantt and not args.spans_dir:  # the whole run's spans, not only the last steps kept in memory
        spans_tmp = tempfile.TemporaryDirectory(prefix="rankscope-spans-")
        args.spans_dir = spans_tmp.name
    sink = Sink(_sink_config(args)).start()
    experiment = resolve("experiment") or generate_experiment_id()
    run = resolve("run") or detect_run(os.environ) or generate_run_id()  # the command is one launch
    env = dict(os.environ)
    env.update(
        RANKSCOPE_EXPERIMENT=experiment,
        RANKSCOPE_RUN_ID=run,
        RANKSCOPE_ENDPOINT=sink.endpoint,
        RANKSCOPE_SINK_CONTROL=f"http://127.0.0.1:{sink.http_port}",
    )
    if args.instrument:
        env.update(auto_instrumentation_env(env))
    print(f"rankscope run: experiment {experiment}, run {run}, sink {sink.endpoint}", file=sys.stderr, flush=True)
    try:
        child = subprocess.Popen(command, env=env)
    except OSError as exc:
        sink.stop()
        print(f"rankscope run: cannot start {command[0]!r}: {exc}", file=sys.stderr)
        return 127
    while True:
        try:
            code = child.wait()
            break
        except KeyboardInterrupt:  # the child got the same SIGINT; wait for it to finish
            continue
    sink.finalize(experiment)
    if args.gantt:
        from . import gantt

        rows = (json.loads(line) for line in sink.span_rows(experiment, run=run) or ())
        written = gantt.write(rows, args.gantt)
        status = sink.status(experiment, run) or {}
        capped = (status.get("span_file") or {}).get("not_saved", 0)
        print(
            f"rankscope run: Gantt of {written.spans} spans, {written.processes} processes -> {args.gantt}"
            + (f" ({capped} spans past the span file's cap are not in it)" if capped else ""),
            file=sys.stderr,
        )
    if args.report:
        answer = sink.report(experiment, run=run)
        if isinstance(answer, str):
            print(f"rankscope run: no report: {answer}", file=sys.stderr)
        for path in [] if isinstance(answer, str) else answer:
            print(f"rankscope run: report -> {path}", file=sys.stderr)
    sink.stop()
    if spans_tmp is not None:
        spans_tmp.cleanup()
    return code if code >= 0 else 128 - code


def auto_instrumentation_env(env: dict[str, str]) -> dict[str, str]:
    """What ``opentelemetry-instrument`` sets: its ``sitecustomize`` first on PYTHONPATH (so every
    Python process of the command loads the distro and the instrumentors), rankscope's distro."""
    from opentelemetry.instrumentation import auto_instrumentation

    here = os.path.dirname(os.path.abspath(auto_instrumentation.__file__))
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != here]
    return {
        "PYTHONPATH": os.pathsep.join([here, os.getcwd(), *paths]),
        "OTEL_PYTHON_DISTRO": env.get("OTEL_PYTHON_DISTRO", "rankscope"),
        "OTEL_PYTHON_CONFIGURATOR": env.get("OTEL_PYTHON_CONFIGURATOR", "rankscope"),
    }


def _steps(text: str | None) -> tuple[int | None, int | None]:
    """``"5"`` → (5, 5); ``"2:8"`` → (2, 8); ``"10:"`` → (10, None)."""
    if not text:
        return None, None
    low, sep, high = text.partition(":")
    first = int(low) if low.strip() else None
    return first, (int(high) if high.strip() else None) if sep else first


def _gantt(args: argparse.Namespace) -> int:
    """Write a Perfetto/Chrome trace-event file from the sink's stored spans or JSONL span files."""
    from . import gantt
    from .sink.traces import parse_ranks

    if bool(args.files) == bool(args.sink):
        print("rankscope gantt: give JSONL span files, or --sink URL --experiment ID", file=sys.stderr)
        return 2
    first, last = _steps(args.steps)
    keep = gantt.Filter(first, last, parse_ranks(args.ranks))
    if args.sink:
        experiment = args.experiment or resolve("experiment")
        if not experiment:
            print("rankscope gantt: --sink needs --experiment (or RANKSCOPE_EXPERIMENT)", file=sys.stderr)
            return 2
        rows = gantt.read_sink(args.sink, experiment, keep, args.token or os.environ.get("RANKSCOPE_SINK_TOKEN"))
    else:
        rows = gantt.read_jsonl(args.files)
    try:
        written = gantt.write(rows, args.output, keep, gz=True if args.gzip else None)
    except (OSError, ValueError) as exc:
        print(f"rankscope gantt: {exc}", file=sys.stderr)
        return 1
    print(
        f"rankscope gantt: {written.spans} spans of {written.processes} processes -> {args.output} "
        "(open in https://ui.perfetto.dev)",
        file=sys.stderr,
    )
    return 0


def _report(args: argparse.Namespace) -> int:
    """Write an experiment's report page: from its report data file, or by asking its sink."""
    if bool(args.data) == bool(args.sink):
        print("rankscope report: give the report data (report.jsonl), or --sink URL --experiment ID", file=sys.stderr)
        return 2
    if args.sink:
        return _report_from_sink(args)
    from .report import page, summary
    from .sink.traces import parse_ranks

    data = Path(args.data)
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


def _add_gantt(found: Any, files: list[str], steps: set[int] | None) -> None:
    """The Gantt of chosen steps (default: the last three) from JSONL span files."""
    from . import gantt
    from .report.summary import gantt_spans, span_seconds

    by_step: dict[int, list[dict[str, Any]]] = {}
    for row in gantt.read_jsonl(files):
        step = row.get("step")
        if isinstance(step, int) and (steps is None or step in steps):
            by_step.setdefault(step, []).append(row)
    chosen = sorted(by_step)[-3:] if steps is None else sorted(by_step)[:8]
    for step in chosen:
        bars, more = gantt_spans(by_step[step])
        ms = span_seconds(bars)
        found.add({"kind": "gantt", "why": f"step {step}", "step": step, "ms": ms, "spans": bars, "more": more})


def _report_from_sink(args: argparse.Namespace) -> int:
    from .export.senders import request_report

    experiment = args.experiment or resolve("experiment")
    if not experiment:
        print("rankscope report: --sink needs --experiment (or RANKSCOPE_EXPERIMENT)", file=sys.stderr)
        return 2
    if args.token:
        os.environ["RANKSCOPE_SINK_TOKEN"] = args.token
    try:
        paths = request_report(args.sink, experiment, timeout=90.0, run=args.run)
    except (OSError, RuntimeError) as exc:
        print(f"rankscope report: {args.sink}: {exc}", file=sys.stderr)
        return 1
    for path in paths:
        print(path)
    return 0


def _capture(args: argparse.Namespace) -> int:
    """Ask a running experiment's processes to profile their next steps; with --wait, print the files."""
    import json
    import time
    import urllib.error
    import urllib.parse
    import urllib.request

    from .sink.traces import parse_ranks

    experiment = args.experiment or resolve("experiment")
    if not experiment:
        print("rankscope capture: give --experiment (or RANKSCOPE_EXPERIMENT)", file=sys.stderr)
        return 2
    ranks = parse_ranks(args.ranks)
    body = {"experiment": experiment, "steps": args.steps, "reason": args.reason, "ranks": sorted(ranks or ()) or None}
    token = args.token or os.environ.get("RANKSCOPE_SINK_TOKEN")
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    base = args.sink.rstrip("/")
    request = urllib.request.Request(f"{base}/rankscope/v1/captures", json.dumps(body).encode(), headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            capture = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        print(
            f"rankscope capture: the sink said {exc.code}: {exc.read()[:300].decode(errors='replace')}", file=sys.stderr
        )
        return 1
    except OSError as exc:
        print(f"rankscope capture: {args.sink}: {exc}", file=sys.stderr)
        return 1
    who = "every process" if ranks is None else f"ranks {','.join(map(str, sorted(ranks)))}"
    print(f"rankscope capture: {capture['id']}: {who}, next {capture['steps']} steps", file=sys.stderr)
    deadline = time.monotonic() + args.wait
    files: dict[str, str] = {}
    while time.monotonic() < deadline:
        time.sleep(0.5)
        status = urllib.request.Request(
            f"{base}/rankscope/v1/status?experiment={urllib.parse.quote(experiment)}", headers=headers
        )
        try:
            with urllib.request.urlopen(status, timeout=10) as response:
                found = next(
                    (c for c in json.loads(response.read()).get("captures", []) if c["id"] == capture["id"]), None
                )
        except OSError:
            continue
        if found is not None:
            files = found["files"]
            if found["taken"] and len(files) >= found["taken"]:
                break
    for label, path in sorted(files.items()):
        print(f"{label}\t{path}")
    return 0


def _top(args: argparse.Namespace) -> int:
    from . import top

    keys = [k.strip() for k in args.keys.split(",") if k.strip()] if args.keys else None
    token = args.token or os.environ.get("RANKSCOPE_SINK_TOKEN")
    return top.run(args.sink, args.experiment, keys, max(0.1, min(args.interval, 1.0)), token, args.once, args.run)


def main(argv: list[str] | None = None) -> int:
    from .sink.wal import default_state_dir

    parser = argparse.ArgumentParser(prog="rankscope", description="rankscope: experiment-scoped telemetry")
    parser.add_argument("--version", action="version", version=f"rankscope {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("identity", help="print the Resource this process would report").set_defaults(fn=_identity)
    commands.add_parser("settings", help="print the settings table (markdown)").set_defaults(fn=_settings)
    for name, fn, grpc_default, http_default, help_text in (
        ("sink", _sink, 4317, 4318, "run the OTLP sink: per-experiment step alignment, reduction and views"),
        ("run", _run, None, None, "run a command with its own sink: rankscope run -- python train.py"),
    ):
        p = commands.add_parser(name, help=help_text)
        p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
        p.add_argument("--grpc-port", type=int, default=grpc_default, help=f"OTLP/gRPC port (default {grpc_default})")
        p.add_argument("--http-port", type=int, default=http_default, help=f"OTLP/HTTP port (default {http_default})")
        p.add_argument(
            "--backends",
            help='views for every experiment as JSON, e.g. \'{"wandb": {"logging_mode": "global_reduce"}}\' '
            "(default: what each experiment's processes ask for, else the console global view)",
        )
        p.add_argument("--grace", type=float, help="seconds to wait for a step's last processes (RANKSCOPE_SINK_GRACE)")
        p.add_argument("--token", help="bearer token clients must send (RANKSCOPE_SINK_TOKEN)")
        p.add_argument(
            "--state-dir",
            default=str(default_state_dir()) if name == "sink" else None,
            help="write-ahead log: what the sink acknowledged survives a crash "
            + ("(default %(default)s)" if name == "sink" else "(default: none)"),
        )
        p.add_argument("--no-state-dir", action="store_true", help="keep acknowledged data in memory only")
        p.add_argument(
            "--resume-window",
            type=float,
            default=7 * 86400.0,
            help="seconds after a run was last seen during which a launch may resume it (default 7 days)",
        )
        p.add_argument(
            "--spans-dir",
            help="write every run's spans here as they arrive (SPANS_DIR/EXPERIMENT/runs/RUN/spans.jsonl): "
            "the whole run's Gantt" + (" (--gantt: a temporary directory)" if name == "run" else ""),
        )
        p.add_argument(
            "--max-span-file-bytes",
            type=int,
            default=1 << 30,
            help="an experiment's span file stops growing here, and says so (default 1 GiB)",
        )
        p.add_argument(
            "--time-bucket",
            type=float,
            default=1.0,
            help="seconds per step of an experiment none of whose processes steps (default 1)",
        )
        p.add_argument(
            "--view-workers",
            type=int,
            default=4,
            help="threads that write every run's views, however many runs are open (default 4)",
        )
        p.add_argument(
            "--report",
            action="store_true",
            help="every experiment also gets the report view: one HTML page, "
            "rankscope_logs/EXPERIMENT/report.html" + (", written when the command ends" if name == "run" else ""),
        )
        if name == "sink":
            p.add_argument(
                "--trust-posted-paths",
                action="store_true",
                help="use the paths in the views clients post as given (default: relative, without '..')",
            )
        if name == "run":
            p.add_argument("--gantt", help="after the command, write its spans as a Perfetto file here")
            p.add_argument(
                "--instrument",
                action="store_true",
                help="auto-instrument every Python process of the command, as opentelemetry-instrument does",
            )
            p.add_argument("command_line", nargs=argparse.REMAINDER, help="-- command [args...]")
        p.set_defaults(fn=fn)
    g = commands.add_parser("gantt", help="write a Perfetto/Chrome trace file: one track per rank, per step")
    g.add_argument("files", nargs="*", help="JSONL span files (the sink's /rankscope/v1/spans format)")
    g.add_argument("--sink", help="the sink's HTTP URL, e.g. http://127.0.0.1:4318")
    g.add_argument("--experiment", help="experiment id to read from the sink (default RANKSCOPE_EXPERIMENT)")
    g.add_argument("--steps", help="step or range: 5, 2:8, 10:")
    g.add_argument("--ranks", help="rank subset: 0,2,4-7")
    g.add_argument("-o", "--output", default="trace.json", help="output file; .gz is gzipped (default trace.json)")
    g.add_argument("--gzip", action="store_true", help="gzip the output whatever its name")
    g.add_argument("--token", help="bearer token of the sink (RANKSCOPE_SINK_TOKEN)")
    g.set_defaults(fn=_gantt)
    r = commands.add_parser("report", help="write an experiment's report: one self-contained HTML page")
    r.add_argument("data", nargs="?", help="the report view's data file (report.jsonl) or its directory")
    r.add_argument("-o", "--output", help="the page (default: report.html beside the data file)")
    r.add_argument("--spans", nargs="+", help="JSONL span files: add the Gantt of --steps (default: the last 3)")
    r.add_argument("--steps", help="steps for the Gantt from --spans: 5 or 3,7 or 2-4")
    r.add_argument("--sink", help="instead: ask this sink (HTTP URL) to write the experiment's page now")
    r.add_argument("--experiment", help="experiment id for --sink (default RANKSCOPE_EXPERIMENT)")
    r.add_argument("--run", help="run of the experiment for --sink (default: its latest)")
    r.add_argument("--token", help="bearer token of the sink (RANKSCOPE_SINK_TOKEN)")
    r.set_defaults(fn=_report)
    c = commands.add_parser("capture", help="profile the next steps of a running experiment's processes")
    c.add_argument("--sink", default="http://127.0.0.1:4318", help="the sink's HTTP URL (default %(default)s)")
    c.add_argument("--experiment", help="experiment id (default RANKSCOPE_EXPERIMENT)")
    c.add_argument("--ranks", help="rank subset: 3,7 or 0-3 (default: every process)")
    c.add_argument("--steps", type=int, default=2, help="steps to profile (default 2)")
    c.add_argument("--reason", default="asked from a shell", help="why (kept with the files)")
    c.add_argument("--wait", type=float, default=0.0, help="seconds to wait for the files, then print them")
    c.add_argument("--token", help="bearer token of the sink (RANKSCOPE_SINK_TOKEN)")
    c.set_defaults(fn=_capture)
    t = commands.add_parser("top", help="a live terminal view of a running sink (q quits)")
    t.add_argument("--sink", default="http://127.0.0.1:4318", help="the sink's HTTP URL (default %(default)s)")
    t.add_argument("--experiment", help="experiment id (default: the one furthest along)")
    t.add_argument("--run", help="run of the experiment (default: its latest)")
    t.add_argument("--keys", help="keys to chart, comma-separated (default: the first six of the last step)")
    t.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default 1)")
    t.add_argument("--once", action="store_true", help="print one screen and exit")
    t.add_argument("--token", help="bearer token of the sink (RANKSCOPE_SINK_TOKEN)")
    t.set_defaults(fn=_top)
    args = parser.parse_args(argv)
    try:
        return int(args.fn(args))
    except ValueError as exc:  # bad RANKSCOPE_*/OTEL_* values
        print(f"rankscope: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
