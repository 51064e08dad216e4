"""The experiment report: looked at in headless Chromium as a person would, built from a real sink.

* the main example (the README's first command's script) prints the global view, names its
  straggler and writes a report whose page shows the charts, every rank and the straggler, and
  reads at a glance: its title the experiment and the run's start, the user's keys first in the
  order recorded, the phases' seconds in Phases only, rankscope's internals folded, a constant
  key a table row, no band legend for a one-process role, plotly's toolbar only on hover;
* a 1,024-process experiment sent over real gRPC gives a page that renders in time and stays
  under ``MAX_PAGE_BYTES``;
* names a client chose reach the page as text, never as markup; any line of the data file is
  taken or skipped, never a crash; the page rebuilt from the file is the live one.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as mpb
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as mgrpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as tpb
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as tgrpc

from rankscope.core import names as attr
from rankscope.metrics.recorder import Recorder
from rankscope.metrics.reduce import Reduce
from rankscope.otlp.common import encode_resource, key_value
from rankscope.otlp.markers import add_flush_marker
from rankscope.otlp.metrics import PointAttributes, encode
from rankscope.report import page, phases, series, summary
from rankscope.sink import BookConfig

from .. import browser

ROOT = Path(__file__).resolve().parents[2]
MAX_PAGE_BYTES = 12_000_000
"""A 1,024-process page: plotly.js (about 4.8 MB) plus the bounded data."""
RENDER_LIMIT_S = 60.0


@dataclass(frozen=True)
class MainExample:
    """One `python examples/main.py` and what it left: its output, its report, its wall time."""

    out: str
    took: float
    cwd: Path
    window: tuple[float, float]
    """Wall-clock seconds (``time.time``) when it was started and when it ended."""


@pytest.fixture(scope="module")
def main_example(browser_ready: None, tmp_path_factory: pytest.TempPathFactory) -> MainExample:
    """`python examples/main.py`, as the README's first command runs it (fewer steps), once for
    the tests that look at what it printed and at its report."""
    tmp_path = tmp_path_factory.mktemp("main-example")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "WANDB_"))}
    env["RANKSCOPE_RUNTIME_DIR"] = str(tmp_path / "run")
    started, wall = time.monotonic(), time.time()
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "main.py"), "--steps", "6"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    return MainExample(out, time.monotonic() - started, tmp_path, (wall, time.time()))


def test_the_main_example_prints_the_view_names_the_straggler_and_its_report_shows_them(
    main_example: MainExample,
) -> None:
    out, took, tmp_path = main_example.out, main_example.took, main_example.cwd
    assert re.search(r"^step 5  ", out, re.M), out[-4000:]  # the compact console: a line per step
    assert re.search(r"trainer/loss [0-9.]+", out) and re.search(r"generator/reward -?[0-9.]+", out)
    assert re.search(r"step [345] straggler: trainer_r2 in train/forward", out), out[-4000:]
    found = re.search(r"^report: (\S+)", out, re.M)
    assert found, out[-3000:]
    report = tmp_path / found.group(1)  # said from the job's directory
    assert report.is_file() and report.is_relative_to(tmp_path / "rankscope_logs")
    html = report.read_text()
    assert "cdn." not in html.split('<script type="application/json"')[0]  # nothing fetched: styles inline
    assert not re.search(r"<script[^>]+src=", html) and not re.search(r"<link[^>]+href=", html)

    with browser.chromium() as driver:
        seconds = browser.open_report(driver, report, timeout=RENDER_LIMIT_S)
        assert browser.errors(driver) == []
        charts = int(driver.execute_script("return document.querySelectorAll('.js-plotly-plot').length"))
        drawn = browser.svg_text(driver)
        alerts = browser.texts(driver, ".alert.straggler")
        roles = browser.texts(driver, "h3.role")
        shot = browser.screenshot(driver, "report-main-example")
    print(f"main example: {took:.1f}s; its report drew {charts} charts in {seconds:.1f}s; screenshot {shot}")
    assert charts >= 12
    for label in ("trainer_r0", "trainer_r1", "trainer_r2", "trainer_r3", "generator_r0"):
        assert label in drawn, label  # heat-map rows and Gantt rows
    for title in ("trainer/loss", "trainer/grad_norm", "generator/reward", "train/forward"):
        assert title in drawn, title
    assert any(a.startswith("straggler: trainer_r2 in train/forward") for a in alerts), alerts
    assert roles == ["trainer (4 processes)", "generator (1 process)"], roles  # the most processes first
    assert shot.stat().st_size > 50_000


# -- the main example's report, read at a glance ------------------------------------------------


def report_of(example: MainExample) -> Path:
    found = re.search(r"^report: (\S+)", example.out, re.M)
    assert found, example.out[-3000:]
    return example.cwd / found.group(1)  # said from the job's directory


def chart_titles(driver: Any, within: str = "") -> list[str]:
    """The titles of the charts drawn in ``within`` (a selector), top to bottom, as on screen."""
    script = "return [...document.querySelectorAll(arguments[0] + ' .gtitle')].map(t => t.textContent)"
    return list(driver.execute_script(script, within or "body"))


def test_the_report_opens_on_the_users_keys_in_the_order_recorded(main_example: MainExample) -> None:
    """The trainer records loss, grad_norm, samples; the generator reward, then response_tokens:
    their charts come first, in that order (samples never changes: a row), before any phase or
    internal chart; rankscope's own keys (rl/*, rankscope/*, straggler/*) are folded at the end."""
    with browser.chromium() as driver:
        browser.open_report(driver, report_of(main_example), timeout=RENDER_LIMIT_S)
        sections = browser.texts(driver, "section > h2")
        metrics = chart_titles(driver, "#metrics")
        everything = chart_titles(driver)
        folded = driver.execute_script("return document.querySelector('#internals details').open")
        hidden_rows = browser.texts(driver, "#internals td")
        driver.find_element("css selector", "#internals summary").click()
        time.sleep(0.5)
        opened = browser.texts(driver, "#internals table.constants td:first-child")
        internal_charts = chart_titles(driver, "#internals")
    assert metrics[:2] == ["trainer/loss", "trainer/grad_norm"], metrics
    assert metrics[2:] == [
        "generator/reward",
        *(f"generator/response_tokens/{s}" for s in ("p50", "p90", "p99", "mean")),
    ]
    assert everything[: len(metrics)] == metrics  # nothing above them
    assert sections[0] == "Metrics" and sections.index("Phases") == 1 and sections[-1] == "Internals", sections
    assert not any(t.startswith(("rl/", "rankscope/", "straggler/")) for t in everything), everything
    assert folded is False and hidden_rows == []  # closed: nothing of it on screen
    assert "rl/lineage_links_dropped (trainer)" in opened and "rankscope/missing_processes" in opened, opened
    assert "straggler/train/forward/over_others" in internal_charts, internal_charts


def test_phase_durations_are_charted_in_phases_only(main_example: MainExample) -> None:
    with browser.chromium() as driver:
        browser.open_report(driver, report_of(main_example), timeout=RENDER_LIMIT_S)
        everything = chart_titles(driver)
        phases = chart_titles(driver, "#phases")
        legends = driver.execute_script(
            "return [...document.querySelectorAll('#phases .chart')]"
            ".map(c => [...c.querySelectorAll('.legendtext')].map(t => t.textContent))"
        )
    assert not [t for t in everything if "duration" in t], everything  # no train/forward/duration_avg_s chart
    assert phases == ["train: seconds per phase (trainer)", "generate: seconds per phase (generator)"], phases
    assert legends == [["data", "forward", "backward", "total"], ["sample", "score", "total"]], legends


def test_a_series_that_never_changes_is_a_table_row_not_a_chart(main_example: MainExample) -> None:
    """``trainer/samples`` is 256 per rank, 1,024 every step."""
    with browser.chromium() as driver:
        browser.open_report(driver, report_of(main_example), timeout=RENDER_LIMIT_S)
        titles = chart_titles(driver)
        rows = browser.rows(driver, "#metrics table.constants")
    assert "trainer/samples" not in titles
    assert rows == [["trainer/samples", "1024", "steps 0–5"]], rows


def test_a_one_process_role_has_no_band_legend(main_example: MainExample) -> None:
    """The generator is one process: its charts show its value alone; the trainer's loss, four
    processes apart, shows the band and the median with their legend."""
    with browser.chromium() as driver:
        browser.open_report(driver, report_of(main_example), timeout=RENDER_LIMIT_S)
        legends = driver.execute_script(
            "return Object.fromEntries([...document.querySelectorAll('#metrics .chart')].map(c => "
            "[c.dataset.key, [...c.querySelectorAll('.legendtext')].map(t => t.textContent)]))"
        )
        bands = driver.execute_script(
            "return [...document.querySelectorAll('#metrics .chart[data-role=generator] .scatterlayer .trace')].length"
        )
    assert sorted(legends["trainer/loss"]) == ["global", "median", "min–max"], legends
    generator = {k: v for k, v in legends.items() if k.startswith("generator/")}
    assert len(generator) == 5 and all(v == [] for v in generator.values()), generator
    assert bands == 5  # one line a chart: no band, no median


def test_the_toolbar_shows_only_on_hover(main_example: MainExample) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    opacity = "return [...document.querySelectorAll('.modebar-container')].map(m => getComputedStyle(m).opacity)"
    with browser.chromium() as driver:
        browser.open_report(driver, report_of(main_example), timeout=RENDER_LIMIT_S)
        at_rest = driver.execute_script(opacity)
        loss = driver.find_element("css selector", "#metrics .chart[data-key='trainer/loss']")
        ActionChains(driver).move_to_element(loss).perform()
        time.sleep(0.6)  # the fade
        hovered = driver.execute_script(
            "return [...document.querySelectorAll('.chart')].map(c => [c.dataset.key, "
            "getComputedStyle(c.querySelector('.modebar-container')).opacity])"
        )
    assert len(at_rest) >= 10 and set(at_rest) == {"0"}, at_rest
    shown = [key for key, value in hovered if value == "1"]
    assert shown == ["trainer/loss"], hovered


def test_the_title_is_the_experiment_and_the_runs_start(main_example: MainExample) -> None:
    report = report_of(main_example)
    experiment = report.relative_to(main_example.cwd / "rankscope_logs").parts[0]
    first, last = main_example.window
    minutes = {time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) for t in range(int(first), int(last) + 61, 30)}
    with browser.chromium() as driver:
        browser.open_report(driver, report, timeout=RENDER_LIMIT_S)
        title = driver.execute_script("return document.title")
        (heading,) = browser.texts(driver, "h1")
    name, _, started = heading.partition(" · ")
    assert name == experiment and started in minutes, (heading, minutes)
    assert title.startswith(heading), title


# -- a 1,024-process experiment over real gRPC ---------------------------------------------------

RANKS, STEPS, SLOW_RANK = 1024, 5, 777


def _resource(experiment: str, rank: int, world: int) -> dict[str, Any]:
    return {
        attr.EXPERIMENT_ID: experiment,
        attr.ROLE: "trainer",
        attr.RANK: rank,
        attr.WORLD_SIZE: world,
        attr.SERVICE_NAME: "trainer",
        attr.SERVICE_INSTANCE_ID: f"trainer-{rank}",
        attr.PROCESS_PID: rank + 1,
        attr.HOST_NAME: f"node{rank // 8}",
    }


def _metrics(experiment: str, ranks: range, step: int, world: int = RANKS) -> mpb.ExportMetricsServiceRequest:
    request = mpb.ExportMetricsServiceRequest()
    now = time.time_ns()
    for rank in ranks:
        scope = request.resource_metrics.add(
            resource=encode_resource(_resource(experiment, rank, world))
        ).scope_metrics.add()
        recorder = Recorder(streams=[])
        recorder.record("loss", 2.0 / (step + 1) + rank / 1e4, Reduce.MEAN)
        recorder.record("grad_norm", 1.0 + (rank % 7) / 10, Reduce.MAX)
        recorder.record("tokens", 4096, Reduce.SUM)
        cache = PointAttributes()
        for key, acc in recorder.accs.items():
            scope.metrics.append(encode(key, acc, step, now - 10**9, now, cache))
        add_flush_marker(scope, [key_value(attr.STEP, step)], len(recorder.accs), now - 10**9, now)
    return request


def _spans(experiment: str, ranks: range, step: int, world: int = RANKS) -> tpb.ExportTraceServiceRequest:
    request = tpb.ExportTraceServiceRequest()
    base = time.time_ns() - 10**10 + step * 10**9
    for rank in ranks:
        spans = request.resource_spans.add(
            resource=encode_resource(_resource(experiment, rank, world))
        ).scope_spans.add()
        start = base
        for i, (phase, seconds) in enumerate((("data", 0.01), ("fwd", 0.05), ("bwd", 0.08))):
            if phase == "fwd" and rank == SLOW_RANK and step >= 2:
                seconds = 0.4  # the straggler
            end = start + int(seconds * 1e9)
            span = spans.spans.add(
                trace_id=(step + 1).to_bytes(16, "big"),
                span_id=(rank * 8 + i + 1).to_bytes(8, "big"),
                name=f"train/{phase}",
                start_time_unix_nano=start,
                end_time_unix_nano=end,
            )
            span.attributes.append(key_value(attr.STEP, step))
            start = end
    return request


def test_a_1024_process_report_renders_in_time_and_stays_small(browser_ready: None, make_sink, tmp_path) -> None:
    experiment = "wide"
    template = str(tmp_path / "reports" / "{experiment}" / "report.html")
    sink = make_sink(backends={"report": {"path": template}}, book=BookConfig(grace=60.0))
    with grpc.insecure_channel(sink.endpoint) as channel:
        metrics, traces = mgrpc.MetricsServiceStub(channel), tgrpc.TraceServiceStub(channel)
        for step in range(STEPS):
            for first in range(0, RANKS, 128):
                chunk = range(first, first + 128)
                assert traces.Export(_spans(experiment, chunk, step), timeout=60).partial_success.rejected_spans == 0
            for first in range(0, RANKS, 128):
                chunk = range(first, first + 128)
                answer = metrics.Export(_metrics(experiment, chunk, step), timeout=60).partial_success
                assert answer.rejected_data_points == 0, answer.error_message
    started = time.monotonic()
    (path,) = sink.report(experiment, timeout=120)
    written = time.monotonic() - started
    report = Path(path)
    size = report.stat().st_size
    status = sink.status(experiment)
    assert status["last_finalized_step"] == STEPS - 1 and status["processes"] == RANKS
    data = json.loads(re.search(r'id="rankscope-data">(.*?)</script>', report.read_text(), re.S).group(1))
    (trainer,) = data["roles"]
    assert trainer["processes"] == RANKS
    loss = next(k for k in trainer["keys"] if k["key"] == "loss")
    assert [p[0] for p in loss["points"]] == list(range(STEPS))
    _, value, median, low, high = loss["points"][-1]
    assert math.isclose(value, 2.0 / STEPS + (RANKS - 1) / 2e4) and math.isclose(median, 2.0 / STEPS + 511.5 / 1e4)
    assert low == 2.0 / STEPS and math.isclose(high, 2.0 / STEPS + 0.1023)
    assert loss["holders"][-1] == ["trainer_r0", "trainer_r1023"]
    assert len(data["heat"][-1]["rows"]) == 128 and data["heat"][-1]["band"] == 8

    with browser.chromium() as driver:
        seconds = browser.open_report(driver, report, timeout=RENDER_LIMIT_S)
        assert browser.errors(driver) == []
        drawn = browser.svg_text(driver)
        alerts = browser.texts(driver, ".alert.straggler")
        pages = driver.execute_script("return document.querySelectorAll('#gantt select')[0].options.length")
        shot = browser.screenshot(driver, "report-1024-processes")
    print(f"1,024 processes: page {size / 1e6:.1f} MB written in {written:.1f}s, drawn in {seconds:.1f}s; {shot}")
    assert size < MAX_PAGE_BYTES, size
    assert "trainer_r0…r7" in drawn and "trainer_r776…r783" in drawn  # heat-map bands of 8 ranks
    assert "trainer_r777" in drawn  # the Gantt's first page: the 64 processes that finished last
    assert pages == 1 + RANKS // 64
    assert any(a.startswith("straggler: trainer_r777 in train/fwd") for a in alerts), alerts


# -- what a client controls -----------------------------------------------------------------------

HOSTILE = '</script><script>window.owned=1</script><img src=x onerror="window.owned=2">&amp;'


def _hostile_summary() -> summary.Summary:
    found = summary.Summary()
    found.add({"kind": "experiment", "id": HOSTILE})
    for step in range(3):
        found.add(
            {
                "kind": "step",
                "step": step,
                "values": {"loss": 1.0 / (step + 1), "nan_key": float("nan")},
                "spread": {HOSTILE: {"loss": [0.5, HOSTILE, 1.5, f"{HOSTILE}_r1", 1.0, 2]}},
                "missing": [HOSTILE],
                "heat": {"rows": [HOSTILE, "b"], "phases": [HOSTILE], "z": [[0.1], [float("inf")]]},
            }
        )
    found.add({"kind": "anomaly", "type": "straggler", "step": 1, "process": HOSTILE, "phase": HOSTILE, "ratio": 3})
    found.add(
        {"kind": "samples", "table": HOSTILE, "step": 2, "rows": [{"row": {HOSTILE: HOSTILE}, "process": HOSTILE}]}
    )
    bar = {"p": HOSTILE, "r": 0, "o": HOSTILE, "n": HOSTILE, "s": 0.0, "d": 5.0, "i": "a", "u": "", "l": ["a"]}
    found.add({"kind": "gantt", "why": HOSTILE, "step": 1, "ms": 5.0, "spans": [bar]})
    return found


def test_names_a_client_chose_reach_the_page_as_text(browser_ready: None, tmp_path: Path) -> None:
    html = page.render(_hostile_summary())
    data = html.split('id="rankscope-data">', 1)[1].split("</script>", 1)[0]
    assert "<" not in data and ">" not in data
    assert "</script><script>window.owned" not in html
    report = page.write(_hostile_summary(), tmp_path / "report.html")
    with browser.chromium() as driver:
        browser.open_report(driver, report, timeout=RENDER_LIMIT_S)
        assert browser.errors(driver) == []
        assert driver.execute_script(
            "return window.owned === undefined && document.querySelectorAll('img').length === 0"
        )
        assert driver.execute_script("return document.title").startswith("</script>")
        texts = browser.texts(driver, "td, h3, .alert")
    assert any(HOSTILE in t for t in texts)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
            lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=6),
            max_leaves=30,
        ).map(lambda v: {"kind": "step", **v} if isinstance(v, dict) else v)
        | st.fixed_dictionaries(
            {
                "kind": st.sampled_from(["step", "gantt", "samples", "anomaly", "status", "experiment"]),
                "step": st.integers(-5, 5) | st.text(max_size=3),
                "values": st.dictionaries(st.text(max_size=6), st.floats() | st.text(max_size=3), max_size=3),
                "spread": st.dictionaries(
                    st.text(max_size=4), st.dictionaries(st.text(max_size=4), st.lists(st.floats(), max_size=7))
                ),
                "spans": st.lists(st.dictionaries(st.sampled_from("prosdiul"), st.integers() | st.text(max_size=3))),
                "rows": st.lists(st.dictionaries(st.text(max_size=4), st.text(max_size=4))),
            }
        ),
        max_size=8,
    )
)
def test_any_line_of_the_data_file_is_taken_or_skipped(events: list[Any]) -> None:
    found = summary.Summary()
    for event in events:
        found.add(event)
    page.data_json(found.data())  # the page's JSON: no NaN, serializable, whatever came in


def test_long_runs_floods_and_wide_steps_are_bounded() -> None:
    found = summary.Summary()
    cell = {"loss": [0, "a", 1, "b", 0.5, 2]}
    for step in range(10_000):
        values: dict[str, Any] = {"loss": float(step), f"straggler/phase{step}/over_others": 2.0}
        if step % 99 == 0:
            values["eval"] = 1.0  # a sparse series keeps its own points
        found.add({"kind": "step", "step": step, "values": values, "spread": {"t": {**cell, "eval": cell["loss"]}}})
    loss, evals = found.series.by_role[("t", "loss")], found.series.by_role[("t", "eval")]
    assert len(loss.points) <= series.MAX_POINTS and loss.stride == 16
    assert [p[0] for p in loss.points][:3] == [0, 16, 32]
    assert [p[0] for p in evals.points] == list(range(0, 10_000, 99))
    (drawn,) = [k for k in found.data()["roles"][0]["keys"] if k["key"] == "loss"]
    assert drawn["points"][-1][0] == 9999  # the last step is always drawn
    assert len(found.series.meta) == series.MAX_META_SERIES  # client-chosen span names: a bounded number of charts
    assert found.series.not_shown == 10_000 - series.MAX_META_SERIES
    bars = [
        {"process": f"p{i}", "name": "x", "start_ns": i, "end_ns": i + 10**6} for i in range(phases.MAX_GANTT_SPANS + 5)
    ]
    kept, more = summary.gantt_spans(bars)
    assert len(kept) == phases.MAX_GANTT_SPANS and more == 5


def test_a_reopened_report_view_keeps_the_pages_history(tmp_path) -> None:
    """An idle experiment's views are closed and reopened on new data (or the sink restarts): the
    page still shows every step, as ``rankscope report FILE`` would."""
    from rankscope.backends.base import Metric
    from rankscope.backends.report import ReportBackend

    config = {"path": str(tmp_path / "{experiment}" / "report.html")}
    for steps in (range(3), range(3, 5)):
        view = ReportBackend(config)
        view.init("global", experiment="again")
        for step in steps:
            view.log_batch([Metric("loss", float(step), Reduce.MEAN)], step)
        view.finish()
    assert view.summary.steps == 5
    assert [p[0] for p in view.summary.series.globals["loss"].points] == [0, 1, 2, 3, 4]
    assert summary.read(tmp_path / "again" / "report.jsonl").data()["globals"] == view.summary.data()["globals"]


def test_the_page_rebuilt_from_the_file_is_the_live_one_and_the_route_says_why_not(make_sink, tmp_path, capsys) -> None:
    """``rankscope report FILE`` after a crash shows what the sink's page showed; the route answers
    404 for an unknown experiment and 409 (naming the fix) for one without the report view."""
    from rankscope.cli import main as cli
    from rankscope.export.senders import request_report

    template = str(tmp_path / "{experiment}" / "report.html")
    sink = make_sink(backends={"report": {"path": template}})
    with grpc.insecure_channel(sink.endpoint) as channel:
        metrics, traces = mgrpc.MetricsServiceStub(channel), tgrpc.TraceServiceStub(channel)
        for step in range(4):
            traces.Export(_spans("r", range(4), step, 4), timeout=10)
            metrics.Export(_metrics("r", range(4), step, 4), timeout=10)
    control = f"http://127.0.0.1:{sink.http_port}"
    (path,) = request_report(control, "r")
    live = Path(path).read_text()
    with pytest.raises(RuntimeError, match="404: no experiment 'nope'"):
        request_report(control, "nope")
    assert cli(["report", str(Path(path).with_suffix(".jsonl")), "-o", str(tmp_path / "again.html")]) == 0
    again = (tmp_path / "again.html").read_text()

    def data(html: str) -> dict[str, Any]:
        found = json.loads(html.split('id="rankscope-data">', 1)[1].split("</script>", 1)[0])
        found.pop("generated")
        return found

    assert data(again) == data(live) and data(live)["steps"] == 4
    assert sink.tenants.experiments["r"].keep_spans  # from its first step: a view draws a Gantt
    assert cli(["report", "--sink", control, "--experiment", "r"]) == 0
    assert capsys.readouterr().out.strip() == path

    plain = make_sink(backends={"jsonl": {"path": str(tmp_path / "plain.jsonl")}})
    with grpc.insecure_channel(plain.endpoint) as channel:
        mgrpc.MetricsServiceStub(channel).Export(_metrics("p", range(2), 0, 2), timeout=10)
    with pytest.raises(RuntimeError, match=r"409: experiment 'p' has no report view \(its views: jsonl\)"):
        request_report(f"http://127.0.0.1:{plain.http_port}", "p")
    assert not plain.tenants.experiments["p"].keep_spans  # no Gantt view: step views do not hold spans
