"""MkDocs hook: generated tables.

A line ``<!-- generated: NAME -->`` in a page is replaced, at build time, by the markdown table
that the code produces, so the docs can never drift from it:

- ``settings``: ``rankscope.core.settings.settings_markdown()``
- ``catalog``: ``rankscope.metrics.catalog.catalog_markdown()``
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

MARKER = re.compile(r"^<!-- generated: (?P<name>[\w.-]+) -->[ \t]*$", re.MULTILINE)


def _generators(config: Any) -> dict[str, Callable[[], str]]:
    try:
        import rankscope  # noqa: F401
    except ImportError:  # not installed: use the checkout's src/
        sys.path.insert(0, str(Path(config["config_file_path"]).resolve().parent / "src"))
    from rankscope.metrics.catalog import catalog_markdown
    from rankscope.core.settings import settings_markdown

    return {"settings": settings_markdown, "catalog": catalog_markdown}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER.search(markdown) is None:
        return markdown
    tables = _generators(config)

    def table(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in tables:
            raise PluginError(
                f"{page.file.src_uri}: '<!-- generated: {name} -->' names an unknown table; "
                f"known: {', '.join(sorted(tables))}"
            )
        return tables[name]().rstrip("\n")

    return MARKER.sub(table, markdown)
