"""``rankscope run``: run a command with a sink of its own, and forward its exit code."""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
from typing import Any

from ..core.settings import resolve
from .sink import add_server_options, sink_config


def add_parser(commands: Any) -> None:
    p = commands.add_parser("run", help="run a command with its own sink: rankscope run -- python train.py")
    add_server_options(p, "run", None, None)
    p.add_argument("--gantt", help="after the command, write its spans as a Perfetto file here")
    p.add_argument(
        "--instrument",
        action="store_true",
        help="auto-instrument every Python process of the command, as opentelemetry-instrument does",
    )
    p.add_argument("command_line", nargs=argparse.REMAINDER, help="-- command [args...]")
    p.set_defaults(fn=command)


def command(args: argparse.Namespace) -> int:
    """Start a sink, run the command with the experiment's environment, forward its exit code."""
    from ..core.identity import detect_run, generate_experiment_id, generate_run_id
    from ..sink import Sink

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
    sink = Sink(sink_config(args)).start()
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
        from ..report import perfetto

        rows = (json.loads(line) for line in sink.span_rows(experiment, run=run) or ())
        written = perfetto.write(rows, args.gantt)
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


