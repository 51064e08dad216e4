"""``rankscope identity``: the Resource this process would report."""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_parser(commands: Any) -> None:
    commands.add_parser("identity", help="print the Resource this process would report").set_defaults(fn=command)


def command(_: argparse.Namespace) -> int:
    from ..core.identity import build_resource

    print(json.dumps(dict(build_resource().attributes), indent=2, sort_keys=True))
    return 0
