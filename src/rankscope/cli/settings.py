"""``rankscope settings``: the settings table, as the docs print it."""

from __future__ import annotations

import argparse
from typing import Any

from ..core.settings import settings_markdown


def add_parser(commands: Any) -> None:
    commands.add_parser("settings", help="print the settings table (markdown)").set_defaults(fn=command)


def command(args: argparse.Namespace) -> int:
    print(settings_markdown())
    return 0
