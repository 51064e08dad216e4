"""A run page's charts read as a researcher reads them: an RL run's page, written by the real report
view (``backends.report``) from the calls a sink makes, looked at in headless Chromium, with what
is measured taken from the drawn elements' bounding boxes:

* a step that is both the first straggler step and the slowest is one Gantt, its title naming
  both reasons;
* a Gantt's legend, plot and x-axis title never overlap;
* the trainer's step gets the Gantt's width: the generator's rollout, 3.5 s before the step, is
  cut at the axis' edge and marked there with its name and times, not drawn whole;
* the heat map's colour bar reads, however few the rows: tall enough, its tick labels apart;
* a late update is said for what it is, and highlighted only where it could not be merged.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rankscope.backends.base import Metric
from rankscope.backends.report import ReportBackend
from rankscope.core.anomalies import Anomaly, Corrected, Partial, Straggler
from rankscope.metrics.reduce import Reduce
from rankscope.report import summary
from rankscope.sink.testing import Process

from .. import browser

RENDER_LIMIT_S = 60.0
MS = 1_000_000
SLOW = 3
"""The step whose rank 2 straggles: the first straggler step, and the slowest."""
ROLLOUT_MS = 3500
"""How long before the trainer's step the generator's rollout for it began (it ended 200 ms before)."""


def process(role: str, rank: int) -> Process:
    return Process(f"{role}-{rank}", f"{role}_r{rank}", role, None, rank, 4, 0, "host", 100 + rank, {})


TRAINERS = [process("trainer", rank) for rank in range(4)]
GENERATORS = [process("generator", rank) for rank in range(2)]


def step_spans(step: int, trainers: list[Process], generators: list[Process]) -> list[dict[str, Any]]:
    """A step's span rows as the sink hands them to the view: each generator's rollout, then each
    trainer's forward (linked to the rollout it learns from, with 12 data spans under rank 1's),
    backward and all-reduce under the step's root span on rank 0; rank 2 slow at ``SLOW``."""
    start = 10_000 * 10**9 + step * 20 * 10**9
    slow = 300 * MS if step == SLOW else 0
    rows: list[dict[str, Any]] = []

    def row(p: Process, name: str, begin: int, end: int, span: str, parent: str | None = None, link: str = "") -> None:
        rows.append(
            {"name": name, "start_ns": start + begin, "end_ns": start + end, "span_id": span, "step": step}
            | {"parent_span_id": parent, "process": p.label, "role": p.role, "rank": p.rank, "attributes": {}}
            | {"links": [{"span_id": link}] if link else []}
        )

    for g in generators:
        row(g, "generate", -ROLLOUT_MS * MS, -200 * MS, f"gen{g.rank}-{step}")
    root = f"root-{step}"
    for p in trainers:
        late = slow if p.rank == 2 else 0
        if p.rank == 0:
            row(p, "step", 0, 900 * MS + slow, root)
        row(p, "train/forward", 10 * MS, 300 * MS + late, f"f{p.rank}-{step}", root, f"gen{p.rank % 2}-{step}")
        if p.rank == 1:
            for i in range(12):  # more span names than one legend line holds
                row(p, f"data/part_{i}", (20 + i) * MS, (21 + i) * MS, f"d{i}-{step}", f"f1-{step}")
        row(p, "train/backward", 300 * MS + late, 700 * MS + late, f"b{p.rank}-{step}", root)
        row(p, "comm/all_reduce", 700 * MS + late, 880 * MS + slow, f"c{p.rank}-{step}", root)
    return rows


def run_page(directory: Path, trainers: list[Process], generators: list[Process], late: Anomaly) -> Path:
    """Six steps of a run through the report view's calls as a sink makes them (a straggler at
    ``SLOW``, one ``late`` update of step 2 after step 4), and its page written."""
    view = ReportBackend({"path": str(directory / "report.html")})
    view.init("global", experiment="rl", run="20260101-120000-abcdef12")
    everyone = trainers + generators
    for step in range(6):
        if step == SLOW:
            record = Straggler(step=step, first_step=step, last_step=step, steps=1, process="trainer_r2", ratio=2.0)
            view.log_anomaly(record, step)
        per = {p: [Metric("loss", 1.0 / (step + 1) + p.rank / 100, Reduce.MEAN)] for p in everyone}
        times = {
            ph: {p: 0.1 + p.rank / 100 + (0.3 if step == SLOW and p.rank == 2 else 0) for p in trainers}
            for ph in ("fwd", "bwd")
        }
        spans: Callable[[], list[dict[str, Any]]] = lambda s=step: step_spans(s, trainers, generators)  # noqa: E731
        metrics = [Metric("loss", 1.0 / (step + 1), Reduce.MEAN, 1.7e9 + step)]
        view.log_batch(metrics, step, per_process=per, phase_times=times, spans=spans)
        if step == 4:
            view.log_anomaly(late, 2)
            view.log_batch([Metric("loss", 0.3, Reduce.MEAN)] if isinstance(late, Corrected) else [], 2, late=True)
    view.report({"runs": [{"run": "20260101-120000-abcdef12", "started": 1.7e9 - 150, "attempt": 0}]})
    view.finish()
    return view.path


SEEN = """
const box = (e) => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
const gantts = [...document.querySelectorAll('.gantt')].map((g) => {
  const xaxis = g._fullLayout.xaxis;
  return { step: g.dataset.step, svg: box(g.querySelector('svg.main-svg')), legend: box(g.querySelector('.legend')),
    title: box(g.querySelector('.g-xtitle')), plot: box(g.querySelector('.nsewdrag')),
    ticks: [...g.querySelectorAll('.xtick text')].map(box), range: xaxis.range,
    bars: [...g.querySelectorAll('.barlayer .point path')].map(box),
    cut: g.data.filter((t) => t.name === 'began before (cut)').map((t) => [t.y, t.text]),
    marks: [...g.querySelectorAll('.scatterlayer .trace text')].map((t) => t.textContent).filter((t) => t) };
});
const bar = document.querySelector('#heatmap .colorbar');
return { gantts, headings: [...document.querySelectorAll('#gantt h3')].map((h) => h.textContent),
  heat: { svg: box(document.querySelector('#heatmap svg.main-svg')), fill: box(bar.querySelector('.cbfill')),
    ticks: [...bar.querySelectorAll('.cbaxis text')].map((t) => [t.textContent, box(t)]),
    title: box(bar.querySelector('.cbtitle text')) },
  facts: [...document.querySelectorAll('.fact')]
    .map((f) => [f.innerText.replace(/\\n/g, ' '), f.classList.contains('bad'), f.title]),
  late: [document.querySelector('#late')?.textContent || '', document.querySelector('#late + p')?.innerText || '',
    document.querySelector('#late + p')?.classList.contains('alert') || false],
  lateRows: [...document.querySelectorAll('table.late tr')].slice(1).map((r) => [...r.cells].map((c) => c.innerText)) };
"""


@dataclass(frozen=True)
class Pages:
    rl: dict[str, Any]
    """What the RL run's page drew (a late update merged into its step)."""
    lone: dict[str, Any]
    """What a one-process run's page drew (one heat-map row; a late update that could not be merged)."""
    rl_file: Path


@pytest.fixture(scope="module")
def pages(browser_ready: None, tmp_path_factory: pytest.TempPathFactory) -> Pages:
    root = tmp_path_factory.mktemp("charts")
    rl = run_page(root / "rl", TRAINERS, GENERATORS, Corrected(step=2, processes=("trainer_r1",), count=1))
    lone = run_page(root / "lone", TRAINERS[:1], [], Partial(step=2, processes=("trainer_r0",), count=1, points=3))
    seen = []
    started = time.monotonic()
    with browser.chromium() as driver:
        for page in (rl, lone):
            browser.open_report(driver, page, timeout=RENDER_LIMIT_S)
            assert browser.errors(driver) == []
            seen.append(driver.execute_script(SEEN))
        browser.screenshot(driver, "report-charts-lone")
    print(f"two pages opened and measured in {time.monotonic() - started:.1f}s")
    return Pages(seen[0], seen[1], rl.with_name("report.jsonl"))


def apart(a: list[float], b: list[float]) -> bool:
    """Two boxes (left, top, right, bottom) share no pixel."""
    return a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1]


def test_a_step_both_first_straggler_and_slowest_is_one_gantt_naming_both(pages: Pages) -> None:
    assert [g["step"] for g in pages.rl["gantts"]] == [str(SLOW), "5"]  # step 3 once, then the last step
    first, last = pages.rl["headings"]
    assert first.startswith(f"step {SLOW} — first straggler and slowest step (") and last.startswith(
        "step 5 — last step ("
    )
    rebuilt = summary.read(pages.rl_file).data()["gantt"]  # `rankscope report` from the file: the same
    assert [(g["step"], g["whys"]) for g in rebuilt] == [
        (SLOW, ["first straggler", "slowest step"]),
        (5, ["last step"]),
    ]


def test_a_gantts_legend_plot_and_axis_title_never_overlap(pages: Pages) -> None:
    for g in pages.rl["gantts"] + pages.lone["gantts"]:
        legend, title, plot = g["legend"], g["title"], g["plot"]
        assert apart(legend, title) and apart(legend, plot) and apart(title, plot), g
        assert all(apart(title, tick) for tick in g["ticks"]), g
        assert g["svg"][1] <= legend[1] and title[3] <= g["svg"][3], g  # both inside the chart, none cut off


def test_the_trainers_step_gets_the_gantts_width_and_the_rollout_before_it_is_cut_and_marked(pages: Pages) -> None:
    slow = pages.rl["gantts"][0]
    own = 900 + 300  # ms: the slow step's trainer spans, its first span to its last end
    low, high = slow["range"]
    assert low < 0 < own < high and high - low <= 1.1 * own  # the trainer's spans, a margin for the marks
    left, _, right, _ = slow["plot"]
    drawn = [
        b for b in slow["bars"] if b[0] >= left - 1 and b[2] <= right + 1
    ]  # the bars inside the plot: the trainer's
    assert min(b[0] for b in drawn) - left < 0.06 * (right - left)
    assert max(b[2] for b in drawn) - min(b[0] for b in drawn) >= 0.85 * (right - left)  # was about 25 % drawn whole
    assert slow["cut"] == [[["generator_r0", "generator_r1"], [f"generate, {ROLLOUT_MS}–200 ms before"] * 2]]
    assert slow["marks"].count(f"generate, {ROLLOUT_MS}–200 ms before") == 2
    lone = pages.lone["gantts"][0]  # nothing before the trainer's spans: the whole step, nothing cut
    assert lone["cut"] == [] and lone["range"][0] <= 0 and lone["range"][1] >= 1200


def test_the_heat_maps_colour_bar_is_readable_and_its_labels_apart(pages: Pages) -> None:
    for heat in (pages.rl["heat"], pages.lone["heat"]):  # six rows; one row (its plot was 15 px tall)
        left, top, right, bottom = heat["fill"]
        assert bottom - top >= 150 and right - left >= 12, heat
        ticks = [b for _, b in heat["ticks"]]
        assert len(ticks) >= 3, heat
        assert all(apart(a, b) for i, a in enumerate(ticks) for b in ticks[i + 1 :]), heat
        assert all(apart(heat["title"], b) for b in ticks), heat
        assert all(heat["svg"][0] <= b[0] and b[2] <= heat["svg"][2] for b in ticks), heat  # none cut off


def test_a_late_update_is_said_for_what_it_is_and_highlighted_only_when_not_merged(pages: Pages) -> None:
    facts = {text.split(" ", 1)[1]: (text.split(" ", 1)[0], bad, title) for text, bad, title in pages.rl["facts"]}
    count, bad, title = facts["late update, merged into its step"]
    assert count == "1" and not bad and "arrived after the sink had finalized the step" in title
    assert "straggler streak" in facts and facts["straggler streak"][1]  # 1, singular; it needs a look
    heading, note, alert = pages.rl["late"]
    assert heading == "late data (1 late update)" and "It was merged" in note and not alert
    assert pages.rl["lateRows"] == [["2", "1", "trainer_r1", "yes"]]

    text, bad, _ = next(f for f in pages.lone["facts"] if "late update" in f[0])
    assert text == "1 late update, 1 not merged: values lack it" and bad
    heading, note, alert = pages.lone["late"]
    assert "1 of 1 could not be merged" in note and alert
    assert pages.lone["lateRows"] == [["2", "1", "trainer_r0", "no"]]
