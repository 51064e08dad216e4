"""The ``rankscope`` command line: builds the parser from each subcommand's module and dispatches.

A subcommand is one module of this package with ``add_parser(commands)`` (its arguments, with
``fn=command``) and ``command(args) -> int``; its heavy imports stay inside ``command`` so
``rankscope --help`` starts at once.
"""

from __future__ import annotations

import argparse
import sys

from .._version import __version__
from . import capture, gantt, identity, report, run, settings, sink, top

SUBCOMMANDS = (identity, settings, sink, run, gantt, report, capture, top)
"""In the order ``rankscope --help`` lists them."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rankscope", description="rankscope: experiment-scoped telemetry")
    parser.add_argument("--version", action="version", version=f"rankscope {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    for subcommand in SUBCOMMANDS:
        subcommand.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args))
    except ValueError as exc:  # bad RANKSCOPE_*/OTEL_* values
        print(f"rankscope: {exc}", file=sys.stderr)
        return 2
