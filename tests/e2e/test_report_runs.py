"""Runs compared, looked at in headless Chromium: two launches of one script under one name, each
with its own sink (as two ``rankscope run``s have), then ``rankscope report rankscope_logs/NAME/``.

The comparison page overlays the runs (one chart per key, a line per run that its legend entry
hides, a box in the runs table that hides it on every chart) and lists them (start, attempts,
steps, status, the configuration keys that differ); each run's own page links the other run,
found on disk although its sink never knew it.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rankscope.cli import main as cli
from rankscope.sink import BookConfig, Sink

from .. import browser
from ..conftest import ROOT
from ..pipeline import clean_env

WORKER = ROOT / "tests" / "workers" / "launch_worker.py"
RENDER_LIMIT_S = 60.0
LAST = 5


def launch(sink: Sink, tag: int, **env: str) -> str:
    """One launch of experiment ``same`` (steps 0..LAST, ``loss = 10 * step + tag``); its run id."""
    done = subprocess.run(
        [sys.executable, str(WORKER), "same", "0", str(LAST), str(tag)],
        env=clean_env(RANKSCOPE_ENDPOINT=sink.endpoint, **env),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split("run ", 1)[1].split()[0]


def written(sink: Sink, run: str) -> None:
    sink.finalize("same")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status = sink.status("same", run)
        if status is not None and status["last_written_step"] >= LAST:
            return
        time.sleep(0.05)
    raise AssertionError(f"run {run} did not write step {LAST}: {sink.status('same', run)}")


def traces(driver: Any, key: str) -> int:
    """Lines drawn in the chart of ``key`` (plotly draws a hidden trace's legend entry only)."""
    return int(
        driver.execute_script(
            "return document.querySelectorAll(`.chart[data-key='${arguments[0]}'] .scatterlayer .trace`).length", key
        )
    )


def titles(driver: Any) -> list[str]:
    """The chart titles drawn, top to bottom."""
    return list(
        driver.execute_script("return [...document.querySelectorAll('.chart .gtitle')].map(t => t.textContent)")
    )


def test_two_runs_of_one_experiment_are_overlaid_and_listed(browser_ready: None, make_sink, tmp_path: Path) -> None:
    logs = tmp_path / "rankscope_logs"
    template = str(logs / "{experiment}" / "{run}" / "report.html")
    runs = []
    for tag, lr in ((1, "0.01"), (2, "0.02")):
        sink = make_sink(
            backends={"report": {"path": template}}, book=BookConfig(grace=10.0)
        )  # a sink of its own per launch
        run = launch(sink, tag, OTEL_RESOURCE_ATTRIBUTES=f"lr={lr},seed=7")
        written(sink, run)
        sink.stop()
        runs.append(run)
    first, second = runs
    assert first != second

    assert cli(["report", str(logs / "same")]) == 0
    page = logs / "same" / "compare.html"
    with browser.chromium() as driver:
        browser.open_report(driver, page, timeout=RENDER_LIMIT_S)
        assert browser.errors(driver) == []
        title = driver.execute_script("return document.title")
        heading = browser.texts(driver, "h1")
        rows = browser.rows(driver, "table.runs")
        charts = titles(driver)
        legend = driver.execute_script(
            "return [...document.querySelectorAll(arguments[0])].map(t => t.textContent)",
            ".chart[data-key='loss'] .legend .legendtext",
        )
        constants = browser.texts(driver, "table.constants td:first-child")
        browser.screenshot(driver, "report-compare")
        drawn_before = traces(driver, "loss")
        toggles = driver.find_elements("css selector", ".chart[data-key='loss'] .legend .traces .legendtoggle")
        toggles[1].click()  # the second run, on this chart
        time.sleep(1.0)  # plotly waits out a double click before it toggles
        after_legend = traces(driver, "loss")
        shown_color = driver.execute_script(
            "return document.querySelector(`.chart[data-key='loss'] .scatterlayer .trace .js-line`).style.stroke"
        )
        toggles[1].click()  # back
        time.sleep(1.0)
        driver.find_element("css selector", "table.runs input[data-run='0']").click()  # the first run, everywhere
        time.sleep(0.5)
        after_box = traces(driver, "loss")
    print(f"compared {first} and {second}: {rows}")
    assert title.startswith("same · 2 runs compared") and heading == ["same · 2 runs compared"]
    assert [r[1].split(" · ")[-1] for r in rows] == [first[-8:], second[-8:]]  # oldest first, start + short id
    for row in rows:
        _, _, started, attempts, steps, status, _ = row
        assert started and attempts == "1" and steps == f"{LAST + 1} (0–{LAST})"
        assert status == "non-finite values at 1 step"  # the worker's NaN grad_norm at its last step
    assert rows[0][6] == "lr=0.01" and rows[1][6] == "lr=0.02"  # only what differs: not seed, not world size
    assert charts == ["loss"]  # one chart per key that changes; grad_norm (one NaN point per run) is a row
    assert constants == ["grad_norm"]
    assert legend == [r[1] for r in rows]  # a line per run, named as the table names it
    assert drawn_before == 2 and after_legend == 1 and shown_color == "rgb(217, 72, 43)"  # the first run's colour
    assert after_box == 1  # the box hid the first run, the second is back

    # each run's own page links the other, found on disk (its sink knew only its own run)
    second_page = logs / "same" / second / "report.html"
    with browser.chromium() as driver:
        browser.open_report(driver, second_page, timeout=RENDER_LIMIT_S)
        links = driver.execute_script(
            "return [...document.querySelectorAll('.runs a')].map(a => [a.textContent, a.href])"
        )
        bold = browser.texts(driver, ".runs b")
    assert [text for text, _ in links] == [first] and links[0][1] == (logs / "same" / first / "report.html").as_uri()
    assert len(bold) == 1 and bold[0].endswith(second[-8:])
