"""The end-to-end tier: real launchers (torchrun, Monarch), the built Collector and Jaeger, Chromium.

What these tests need that takes minutes the first time (building the binaries, installing the
browser) is done here, once per session and only when a selected test asks for it, so that no
test's own time limit pays for it and the faster tiers never do.
"""

from __future__ import annotations

import pytest

PIPELINE_BINARIES = pytest.StashKey[dict[str, str]]()
BROWSER_MISSING = pytest.StashKey[str | None]()
TMUX_MISSING = pytest.StashKey[str | None]()
PROMETHEUS_MISSING = pytest.StashKey[str | None]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build (or find cached) the Collector and Jaeger binaries, and install Chromium, if a
    selected test uses them. Each has its own time limit (``tests/pipeline.py``, ``tests/browser.py``)."""
    wanted = {name for item in session.items for name in getattr(item, "fixturenames", ())}
    if "binaries" in wanted:
        from ..pipeline import build_binaries

        session.config.stash[PIPELINE_BINARIES] = build_binaries()
    if "browser_ready" in wanted:
        from ..browser import ensure_browser  # apt-get install chromium chromium-driver, once per machine

        session.config.stash[BROWSER_MISSING] = ensure_browser()
    if "tmux_ready" in wanted:
        from ..browser import apt_ensure

        session.config.stash[TMUX_MISSING] = apt_ensure(["/usr/bin/tmux"], ["tmux"])
    if "prometheus_ready" in wanted:
        from ..browser import apt_ensure

        session.config.stash[PROMETHEUS_MISSING] = apt_ensure(["/usr/bin/prometheus"], ["prometheus"])


@pytest.fixture(scope="session")
def browser_ready(request: pytest.FixtureRequest) -> None:
    """Chromium is there (installed by ``pytest_collection_finish``), or the test fails saying why."""
    missing = request.config.stash.get(BROWSER_MISSING, "the browser was not looked for")
    if missing:
        pytest.fail(f"headless Chromium is needed to look at the report: {missing}")


@pytest.fixture(scope="session")
def tmux_ready(request: pytest.FixtureRequest) -> None:
    """tmux is there (installed by ``pytest_collection_finish``): ``rankscope top``'s screen is read from a pane."""
    missing = request.config.stash.get(TMUX_MISSING, "tmux was not looked for")
    if missing:
        pytest.fail(f"tmux is needed to read rankscope top's screen: {missing}")


@pytest.fixture(scope="session")
def prometheus_ready(request: pytest.FixtureRequest) -> None:
    """Prometheus is there (Debian's, installed by ``pytest_collection_finish``): the otlp view's series land in it."""
    missing = request.config.stash.get(PROMETHEUS_MISSING, "Prometheus was not looked for")
    if missing:
        pytest.fail(f"Prometheus is needed to read the merged series back: {missing}")


@pytest.fixture(scope="session")
def binaries(request: pytest.FixtureRequest) -> dict[str, str]:
    """The Collector and Jaeger, built by ``pytest_collection_finish`` before any test started."""
    return request.config.stash[PIPELINE_BINARIES]
