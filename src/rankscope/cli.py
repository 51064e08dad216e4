"""The ``rankscope`` command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from typing import Any

from ._internal.settings import resolve, settings_markdown
from ._version import __version__


def _identity(_: argparse.Namespace) -> int:
    from ._internal.identity import build_resource

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
    )


def _sink(args: argparse.Namespace) -> int:
    from .sink import Sink

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    sink = Sink(_sink_config(args)).start()
    print(
        f"rankscope sink: OTLP/gRPC on {args.host}:{sink.grpc_port}, OTLP/HTTP on {args.host}:{sink.http_port}",
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
    from ._internal.identity import generate_experiment_id
    from .sink import Sink

    command = args.command_line[1:] if args.command_line[:1] == ["--"] else args.command_line
    if not command:
        print("rankscope run: give a command, e.g. rankscope run -- python train.py", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    args.grpc_port = args.grpc_port if args.grpc_port is not None else 0
    args.http_port = args.http_port if args.http_port is not None else 0
    sink = Sink(_sink_config(args)).start()
    experiment = resolve("experiment") or generate_experiment_id()
    env = dict(os.environ)
    env.update(
        RANKSCOPE_EXPERIMENT=experiment,
        RANKSCOPE_ENDPOINT=sink.endpoint,
        RANKSCOPE_SINK_CONTROL=f"http://127.0.0.1:{sink.http_port}",
    )
    print(f"rankscope run: experiment {experiment}, sink {sink.endpoint}", file=sys.stderr, flush=True)
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
    sink.stop()
    return code if code >= 0 else 128 - code


def main(argv: list[str] | None = None) -> int:
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
        if name == "run":
            p.add_argument("command_line", nargs=argparse.REMAINDER, help="-- command [args...]")
        p.set_defaults(fn=fn)
    args = parser.parse_args(argv)
    try:
        return int(args.fn(args))
    except ValueError as exc:  # bad RANKSCOPE_*/OTEL_* values
        print(f"rankscope: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
