"""The docs site builds strictly, its generated tables are the code's, and the README stays short."""

from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

from rankscope.core.settings import SETTINGS
from rankscope.metrics.catalog import CATALOG

from ..conftest import ROOT

MKDOCS = Path(sys.executable).parent / "mkdocs"  # installed with the test extra


def test_the_docs_build_strictly_with_the_codes_settings_and_catalog(tmp_path: Path) -> None:
    site = tmp_path / "site"
    built = subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    settings = html.unescape((site / "settings" / "index.html").read_text())
    for setting in SETTINGS:  # every row the code has, in the page as generated at build time
        assert f"<code>{setting.env}</code>" in settings, setting.env
    catalog = html.unescape((site / "instrumentation" / "index.html").read_text())
    for spec in CATALOG:
        assert f"<code>{spec.name}</code>" in catalog, spec.name
    assert "<!-- generated:" not in settings + catalog


def test_the_readme_is_short_and_its_test_command_is_what_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", readme):  # the screenshot is in the repository
        assert (ROOT / image).is_file(), image
    command = "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest"
    assert command in readme
    assert command in (ROOT / ".ci" / "run").read_text()


TIMING = re.compile(r"<!-- timing:([\w-]+) -->(.+?)<!-- /timing -->", re.S)
ABOUT = re.compile(r"\babout \d+(?:\.\d+)? ?(?:s|seconds|min|minutes)\b")
TIMED_PAGES = ("README.md", "docs/getting-started.md", "docs/development.md", "docs/tutorial.md")


def test_every_timing_the_docs_give_is_one_figure_with_its_load_the_same_on_every_page() -> None:
    """The main example, the unit tier, the whole suite, a short job: each timing is written once in
    one form (``<!-- timing:NAME -->about N s on ... VM<!-- /timing -->``, with the machine and its
    load), the same
    on every page that gives it; and those pages give no other ``about N s`` unmarked."""
    said: dict[str, set[str]] = {}
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text()
        for name, phrase in TIMING.findall(text):
            said.setdefault(name, set()).add(" ".join(phrase.split()))
        if str(page.relative_to(ROOT)) in TIMED_PAGES:
            unmarked = ABOUT.findall(TIMING.sub("", text))
            assert unmarked == [], f"{page.name}: a timing without its marker: {unmarked}"
    assert {"main-example", "unit", "suite", "short-job"} <= said.keys(), said
    for name, phrases in said.items():
        assert len(phrases) == 1, f"timing {name!r} differs between pages: {phrases}"
        (phrase,) = phrases
        assert re.match(r"about \d", phrase) and "2-core VM" in phrase, phrase  # a figure, on a named machine
        assert "idle" in phrase or "busy" in phrase or "first time" in phrase, phrase  # and its load
