"""The ``rankscope`` command line."""

from __future__ import annotations

import argparse
import json
import sys

from ._internal.settings import settings_markdown
from ._version import __version__


def _identity(_: argparse.Namespace) -> int:
    from ._internal.identity import build_resource

    print(json.dumps(dict(build_resource().attributes), indent=2, sort_keys=True))
    return 0


def _settings(args: argparse.Namespace) -> int:
    print(settings_markdown())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rankscope", description="rankscope: experiment-scoped telemetry")
    parser.add_argument("--version", action="version", version=f"rankscope {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("identity", help="print the Resource this process would report").set_defaults(fn=_identity)
    commands.add_parser("settings", help="print the settings table (markdown)").set_defaults(fn=_settings)
    args = parser.parse_args(argv)
    try:
        return int(args.fn(args))
    except ValueError as exc:  # bad RANKSCOPE_*/OTEL_* values
        print(f"rankscope: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
