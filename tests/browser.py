"""Headless Chromium for tests that look at a page as a person would (Debian's chromium and
chromium-driver packages, driven by selenium; nothing is downloaded at test time but the two
packages, installed once by ``ensure_browser`` when the machine has apt and root).

Point ``RANKSCOPE_CHROMIUM``/``RANKSCOPE_CHROMEDRIVER`` elsewhere to use another build. Screenshots
go to ``$RANKSCOPE_TEST_ARTIFACTS`` (default ``test-artifacts/`` in the repository, ignored by git).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = os.environ.get("RANKSCOPE_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("RANKSCOPE_CHROMEDRIVER", "/usr/bin/chromedriver")
ARTIFACTS = Path(os.environ.get("RANKSCOPE_TEST_ARTIFACTS", Path(__file__).resolve().parent.parent / "test-artifacts"))


def ensure_browser() -> str | None:
    """None when Chromium and its driver are there (installing them with apt if need be), else why not."""
    return apt_ensure([CHROMIUM, CHROMEDRIVER], ["chromium", "chromium-driver"])


def apt_ensure(paths: list[str], packages: list[str]) -> str | None:
    """None when every one of ``paths`` exists (installing Debian's ``packages`` if need be, as
    root), else why not."""
    if all(os.path.exists(p) for p in paths):
        return None
    names = " ".join(packages)
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        return f"no {' / '.join(paths)}, and no apt-get as root to install {names}"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        subprocess.run(["apt-get", "update", "-q"], env=env, check=True, capture_output=True, timeout=600)
        subprocess.run(
            ["apt-get", "install", "-y", "-q", *packages], env=env, check=True, capture_output=True, timeout=900
        )
    except (subprocess.SubprocessError, OSError) as exc:
        return f"installing {names} failed: {exc}"
    return None if all(os.path.exists(p) for p in paths) else f"{names} did not install"


@contextmanager
def chromium(width: int = 1400, height: int = 1000) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.add_argument(f"--window-size={width},{height}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def open_report(driver: Any, page: Path, timeout: float) -> float:
    """Open the page from disk and wait until its script has drawn every chart; seconds it took."""
    start = time.monotonic()
    driver.get(page.resolve().as_uri())
    while time.monotonic() - start < timeout:
        if driver.execute_script("return document.body.dataset.ready === '1' && document.body.dataset.charts"):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"{page} was not drawn within {timeout}s")
    # charts below the fold draw when scrolled to: scroll like a reader, a frame at a time, until none waits
    while driver.execute_script("return (document.body.dataset.pending || '0') !== '0'"):
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{page}: charts below the fold were not drawn within {timeout}s")
        height = driver.execute_script("return document.body.scrollHeight")
        for y in range(0, height + 800, 600):
            driver.execute_script(f"window.scrollTo(0, {y})")
            time.sleep(0.03)
    driver.execute_script("window.scrollTo(0, 0)")
    return time.monotonic() - start


def errors(driver: Any) -> list[dict[str, Any]]:
    """The console's errors and uncaught exceptions since the last call."""
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def svg_text(driver: Any) -> list[str]:
    """What the charts wrote (axis labels, titles, legends): drawn text, not the page's data."""
    return list(driver.execute_script("return [...document.querySelectorAll('svg text')].map(t => t.textContent)"))


def texts(driver: Any, selector: str) -> list[str]:
    """The text a reader sees in each element matching ``selector``."""
    return list(
        driver.execute_script("return [...document.querySelectorAll(arguments[0])].map(e => e.innerText)", selector)
    )


def rows(driver: Any, selector: str) -> list[list[str]]:
    """The text a reader sees in each cell of each row (the header row left out) of the tables
    matching ``selector``."""
    script = (
        "return [...document.querySelectorAll(arguments[0] + ' tr')]"
        ".filter(r => r.querySelector('td')).map(r => [...r.cells].map(c => c.innerText))"
    )
    return list(driver.execute_script(script, selector))


def screenshot(driver: Any, name: str) -> Path:
    """The whole page as a PNG under ``ARTIFACTS`` (kept after the test)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    height = min(16000, int(driver.execute_script("return document.body.scrollHeight")))
    driver.set_window_size(1400, height)
    time.sleep(0.5)
    path = ARTIFACTS / f"{name}.png"
    driver.save_screenshot(str(path))
    return path
