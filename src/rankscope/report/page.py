"""The report as one static HTML file: the summary's data, plotly.js and the page's own script
and style, all inlined, so it opens from disk on an air-gapped machine (no network, no server).

plotly.js comes from the ``plotly`` Python package (``plotly.offline.get_plotlyjs()``), the
copy its own offline HTML inlines: about 4.8 MB of the page, whatever the experiment's size.
The data is JSON in a ``<script type="application/json">`` element with ``<``, ``>`` and ``&``
escaped, so no name a client chose can close the element; the page's script puts names into
the document as text, never as markup.

A run's page written in its run's directory (``{experiment}/{run}/report.html``) lists the
experiment's runs its sink knew and, found on disk when it is written, the other run
directories beside it (``siblings``): two launches that each had their own sink still link
each other, once a page is written after both (the sink writes it again when asked;
``rankscope report RUN_DIR`` rebuilds it).
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

from ..core.paths import safe_component
from .summary import Summary
from .values import relative_link

DATA = "report.jsonl"
PAGE = "report.html"
MAX_RUN_DIRS = 1000
"""Entries of an experiment directory looked at for runs."""
MAX_LISTED_RUNS = 100

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


def when(seconds: float | None, precise: bool = False) -> str | None:
    """A wall-clock time as the page shows it (this machine's time zone), to the minute (or second)."""
    shape = "%Y-%m-%d %H:%M:%S" if precise else "%Y-%m-%d %H:%M"
    return None if seconds is None else time.strftime(shape, time.localtime(seconds))


def title_of(summary: Summary) -> str:
    """The page's title: the experiment and when its run started (the tab, the heading)."""
    started = when(summary.started_at())
    return f"{summary.experiment or '(unnamed experiment)'}" + (f" · {started}" if started else "")


def document(title: str, data: dict[str, Any], script: str) -> str:
    """One self-contained page: ``data`` as JSON, plotly.js, the shared script and style, and
    the page's own ``script`` (an asset's name)."""
    return (
        "<!doctype html>\n<html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width, initial-scale=1">'
        f"<title>{_title(title[:300])}</title><style>{_asset('report.css')}</style></head>\n"
        '<body><div id="app"><p class="loading">Rendering the report...</p></div>\n'
        f'<script type="application/json" id="rankscope-data">{data_json(data)}</script>\n'
        f"<script>{plotly_js()}</script>\n<script>{_asset('common.js')}</script>\n"
        f"<script>{_asset(script)}</script>\n</body></html>\n"
    )


def render(summary: Summary, path: Path | None = None) -> str:
    """The page's HTML (to be written to ``path``: it lists the runs found beside it, ``siblings``)."""
    data = summary.data()
    if path is not None:
        data["runs"] = siblings(path, summary.run, data["runs"])
    data["generated"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    data["title"] = title_of(summary)
    data["started_text"] = when(data["started"])
    return document(f"{data['title']} · rankscope", data, "report.js")


def write(summary: Summary, path: Path) -> Path:
    """Write the page atomically (a reader never sees half a page)."""
    return write_html(render(summary, path), path)


def write_html(html: str, path: Path) -> Path:
    """Write a page atomically: a temporary file beside it, renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")  # unique; the umask's mode, like any page
    try:
        with tmp.open("x", encoding="utf-8") as out:
            out.write(html)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


# -- the runs beside a page


def run_dirs(directory: Path) -> list[Path]:
    """The run directories of an experiment's directory: each subdirectory holding a report
    view's data (``report.jsonl``), by name."""
    try:
        entries = sorted(directory.iterdir())[:MAX_RUN_DIRS]
    except OSError:
        return []
    return [entry for entry in entries if (entry / DATA).is_file()]


def siblings(page: Path, run: str, listed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs a run's page lists: ``listed`` (its sink's, newest first, linked), then the other
    runs of the experiment found on disk beside it (a launch that had a sink of its own), newest
    first, linked relative to the page. Only where the page sits in its run's own directory
    (``{experiment}/{run}/report.html``): elsewhere what is beside it is not its runs."""
    here = page.parent
    if not run or here.name != safe_component(run):
        return listed
    known = {safe_component(str(r.get("run") or "")) for r in listed} | {here.name}
    found = []
    for directory in run_dirs(here.parent):
        other = directory / page.name
        if directory.name not in known and other.is_file():
            found.append((_mtime(directory / DATA), directory.name, relative_link(os.path.relpath(other, here))))
    if not found:
        return listed
    own = [] if any(r.get("run") == run for r in listed) else [{"run": run, "started": None, "attempt": None}]
    on_disk = [{"run": name, "started": None, "attempt": None, "href": href} for _, name, href in sorted(found)[::-1]]
    return (own + listed + on_disk)[:MAX_LISTED_RUNS]


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
