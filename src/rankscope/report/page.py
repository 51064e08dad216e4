"""The report as one static HTML file: the summary's data, plotly.js and the page's own script
and style, all inlined, so it opens from disk on an air-gapped machine (no network, no server).

plotly.js comes from the ``plotly`` Python package (``plotly.offline.get_plotlyjs()``), the
copy its own offline HTML inlines: about 4.8 MB of the page, whatever the experiment's size.
The data is JSON in a ``<script type="application/json">`` element with ``<``, ``>`` and ``&``
escaped, so no name a client chose can close the element; the page's script puts names into
the document as text, never as markup.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from .summary import Summary

_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"})


@cache
def _asset(name: str) -> str:
    return (resources.files("rankscope.report") / "assets" / name).read_text(encoding="utf-8")


@cache
def plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    return str(get_plotlyjs())


def data_json(data: dict[str, Any]) -> str:
    """JSON that is safe inside a script element (and has no NaN: the summary made them null)."""
    return json.dumps(data, separators=(",", ":"), allow_nan=False, default=str).translate(_ESCAPES)


def _title(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def render(summary: Summary) -> str:
    """The page's HTML."""
    data = summary.data()
    data["generated"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    title = f"rankscope report: {summary.experiment or 'experiment'}"[:300]
    return (
        "<!doctype html>\n<html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width, initial-scale=1">'
        f"<title>{_title(title)}</title><style>{_asset('report.css')}</style></head>\n"
        '<body><div id="app"><p class="loading">Rendering the report...</p></div>\n'
        f'<script type="application/json" id="rankscope-data">{data_json(data)}</script>\n'
        f"<script>{plotly_js()}</script>\n<script>{_asset('report.js')}</script>\n</body></html>\n"
    )


def write(summary: Summary, path: Path) -> Path:
    """Write the page atomically (a reader never sees half a page)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")  # unique; the umask's mode, like any page
    try:
        with tmp.open("x", encoding="utf-8") as out:
            out.write(render(summary))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
