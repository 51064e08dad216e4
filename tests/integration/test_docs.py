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
