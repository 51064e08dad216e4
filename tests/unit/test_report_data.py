"""The report view's data file (``report.jsonl``): compacted to a snapshot of the summary plus
the events since, it stays bounded however long the run, and reading it back (reopening the
view, ``rankscope report FILE``) gives the page the uncompacted events give."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from rankscope.backends.base import Metric
from rankscope.backends.report import ReportBackend
from rankscope.core.anomalies import Anomaly, NonFinite, SlowStep, Straggler
from rankscope.metrics.reduce import Reduce
from rankscope.report import page
from rankscope.report.series import MAX_META_SERIES, MAX_SERIES
from rankscope.report.summary import Summary, read
from rankscope.sink.testing import Process

NEVER = 1 << 62
"""A compaction bound no test reaches: the uncompacted reference."""


def process(role: str, rank: int) -> Process:
    return Process(f"{role}-{rank}", f"{role}_r{rank}", role, None, rank, 4, 0, "host", 100 + rank, {})


TRAINERS = [process("trainer", rank) for rank in range(4)]
GENERATORS = [process("generator", rank) for rank in range(2)]
TRAINER_KEYS = ["loss", "lr", *(f"train/k{i}" for i in range(6))]
GENERATOR_KEYS = ["gen/tokens", "gen/k0", "gen/k1"]


def page_data(summary: Summary) -> str:
    """What the page embeds (``rankscope report`` writes it from ``read(FILE)``)."""
    return page.data_json(summary.data())


def backend(path: Path, compact_bytes: int) -> ReportBackend:
    view = ReportBackend({"path": str(path), "compact_bytes": compact_bytes})
    view.init("trainer_r0", experiment="exp", run="run-1")
    return view


def spans_of(step: int, rng: random.Random) -> list[dict[str, Any]]:
    rows = []
    for p in TRAINERS + GENERATORS:
        start = step * 1_000_000_000
        end = start + int(rng.uniform(1e8, 9e8))
        attributes = {"rankscope.caller": "train.py:12"} if p.rank == 0 else {}
        for i, name in enumerate(("step", "forward")):
            rows.append(
                {
                    **{"name": name, "start_ns": start + i, "end_ns": end - i, "span_id": f"{p.label}-{step}-{i}"},
                    **{"parent_span_id": f"{p.label}-{step}-0" if i else None, "process": p.label, "role": p.role},
                    **{"rank": p.rank, "attributes": attributes, "links": [{"span_id": "g-1"}] if i else []},
                }
            )
    return rows


def spread_values(step: int, rng: random.Random) -> tuple[dict[str, float], dict[Process, list[Metric]]]:
    """The step's global values and each process's (trainer_r3 missing every 7th step)."""
    values: dict[str, float] = {}
    per: dict[Process, list[Metric]] = {}
    for group, keys in ((TRAINERS, TRAINER_KEYS), (GENERATORS, GENERATOR_KEYS)):
        extra = [f"late/{step}"] if step % 37 == 0 else []  # role series past MAX_SERIES: refused
        for p in group:
            if step % 7 == 3 and p is TRAINERS[3]:
                continue  # the step went without it
            value = [rng.gauss(0, 1) for _ in keys + extra]
            if step % 31 == 0 and p.rank == 1:
                value[0] = float("nan") if step % 2 else float("inf")
            per[p] = [Metric(k, v, Reduce.MEAN) for k, v in zip(keys + extra, value, strict=True)]
        for k in keys + extra:
            values[k] = rng.gauss(0, 1)
    return values, per


def calls(
    steps: int, seed: int = 7, rewinds: dict[int, int] | None = None, report_at: int = 199
) -> Iterator[Callable[[ReportBackend], Any]]:
    """A run of ``steps`` steps as view calls, each the same for every view it is given to:
    two roles' spreads with non-finite values, sparse and derived keys, more global and
    ``rankscope/*`` keys than a page keeps, missing processes, late updates, heat, spans,
    anomalies (stragglers among them), sample tables (more than are kept), the sink's
    status and runs (at step ``report_at``), and a rewind at each step of ``rewinds`` (to the
    step it names)."""
    rng = random.Random(seed)
    rewinds = dict(rewinds or {})
    step = 0
    done = 0
    while done < steps:
        if step in rewinds:
            back = rewinds.pop(step)
            yield lambda v, back=back: v.rewind(back)
            step = back
        values, per = spread_values(step, rng)
        values.update({"rankscope/step_seconds": rng.random(), "straggler/forward": rng.random()})
        for i in (2 * step, 2 * step + 1):  # more than a page keeps by step 250
            values[f"rankscope/m{i % (MAX_META_SERIES + 30)}"] = rng.random()
            values[f"g/{i % (MAX_SERIES + 100)}"] = rng.random()
        values["loss/argmax_rank"] = 2.0
        if step % 100 == 0:
            values["eval/acc"] = rng.random()
        metrics = [Metric(k, v, Reduce.MEAN) for k, v in values.items()]
        phases = {ph: {p: rng.random() for p in TRAINERS} for ph in ("forward", "backward", "optimizer")}
        spans = spans_of(step, rng)
        missing = ["trainer_r3"] if step % 7 == 3 else []
        record: Anomaly = SlowStep(step=step, seconds=rng.random(), median_s=float("inf"))
        yield lambda v, record=record, step=step: v.log_anomaly(record, step)
        if step % 4 == 0:
            record = NonFinite(step=step, key="loss", keys=("loss", "x" * 600))
            yield lambda v, record=record, step=step: v.log_anomaly(record, step)
        if step % 11 == 0:
            record = Straggler(step=step, first_step=step, last_step=step, process=f"trainer_r{step % 4}")
            record = replace(
                record, phase="forward", ratio=1 + rng.random(), seconds=rng.random(), others_s=float("nan")
            )
            yield lambda v, record=record, step=step: v.log_anomaly(record, step)

        arguments = {"per_process": per, "phase_times": phases, "missing": missing}
        yield lambda v, m=metrics, step=step, kw=arguments, spans=spans: v.log_batch(m, step, spans=lambda: spans, **kw)
        if step % 13 == 0 and step >= 3:
            late = [Metric("loss", rng.random(), Reduce.MEAN), Metric("g/1", rng.random(), Reduce.MEAN)]
            yield lambda v, late=late, step=step: v.log_batch(late, step - 3, late=True)
        if step % 3 == 0:
            rows = [
                {"row": {"prompt": f"p{step}", "score": rng.random(), "inf": float("inf"), "list": [1, 2]}}
                | {"side": "trainer", "process": "trainer_r0", "policy_version": step, "trace_id": "ab" * 16}
            ]
            table = f"table{step % 20}"
            yield lambda v, rows=rows, step=step, table=table: v.log_samples(table, rows, step)
            if step % 9 == 0:
                yield lambda v, rows=rows, step=step, table=table: v.log_samples(table, rows, step, late=True)
        if step == report_at:
            status: dict[str, Any] = {"points": step * 20, "processes": 6, "late_points": 3, "internal_errors": 0}
            status["runs"] = [{"run": "run-0", "started": 1.5, "attempt": 0}, {"run": "run-1", "started": 9.0}]
            yield lambda v, status=status: v.report(status)
        step += 1
        done += 1


def starts_with_a_snapshot(path: Path) -> bool:
    with path.open("rb") as f:
        return f.readline().startswith(b'{"kind":"snapshot"')


def test_a_compacted_file_reads_back_as_the_page_the_events_make(tmp_path: Path) -> None:
    compacted = backend(tmp_path / "compacted" / "report.html", compact_bytes=0)  # 2 × the snapshot only
    plain = backend(tmp_path / "plain" / "report.html", compact_bytes=NEVER)
    compactions = 0
    inode = compacted.data_path.stat().st_ino
    for i, call in enumerate(calls(420, rewinds={150: 120, 330: 250})):
        for view in (compacted, plain):
            call(view)
        if compacted.data_path.stat().st_ino != inode:
            compactions += 1
            inode = compacted.data_path.stat().st_ino
        if i % 700 == 699:  # mid-run as well: the file is read as it is, compacted or not
            compacted._file.flush()
            plain._file.flush()
            assert page_data(read(compacted.data_path)) == page_data(read(plain.data_path))
    for view in (compacted, plain):
        view.finish()
    assert compactions >= 5 and starts_with_a_snapshot(compacted.data_path)
    assert not starts_with_a_snapshot(plain.data_path)
    assert compacted.data_path.stat().st_size < plain.data_path.stat().st_size
    reference = read(plain.data_path)
    found = read(compacted.data_path)
    # everything a page holds was reached: refusals, bounds, rewinds, stragglers' Gantt
    data = reference.data()
    assert reference.phases.heat_stride >= 2 and data["series_not_shown"] > 0 and data["tables_not_shown"] > 0
    assert any(isinstance(name, tuple) for name in reference.series._refused)
    assert len(data["rewinds"]) == 2 and data["late_updates"] > 0 and data["missing"] and data["heat"]
    assert {g["why"] for g in data["gantt"]} == {"first straggler", "slowest step", "last step"}
    assert len(data["anomalies"]) == 500 and data["stragglers"] and data["samples"] and data["runs"]
    assert page_data(found) == page_data(reference) == page_data(compacted.summary) == page_data(plain.summary)
    assert found.data() == reference.data()


def summary_events(steps: int, seed: int) -> Iterator[Any]:
    """A long run as ``report.jsonl`` events, made without a view (cheap, so series thin out
    twice): a role's spread, globals, ``rankscope/*``, heat, late updates, missing processes,
    rewinds, anomalies, samples, Gantts, status and runs, and lines no summary takes."""
    rng = random.Random(seed)
    keys = ["loss", "lr", "grad_norm"]
    yield {"kind": "experiment", "id": "exp", "run": "run-1"}
    step = 0
    for i in range(steps):
        if i in (600, 1_300):
            yield {"kind": "rewind", "step": step - 150}
            step -= 150
        values: dict[str, Any] = {k: rng.gauss(0, 1) for k in keys}
        values.update({"rankscope/step_seconds": rng.random(), f"g/{i % 40}": rng.random(), "loss/argmax_rank": 3})
        if i % 50 == 0:
            values["eval/acc"] = None if i % 100 else rng.random()
        spread = {
            "trainer": {k: [values[k] - 1, f"trainer_r{i % 4}", values[k] + 1, "trainer_r3", 0.5, 4] for k in keys}
        }
        event: dict[str, Any] = {"kind": "step", "step": step, "values": values, "spread": spread}
        if i % 7 == 0:
            event["missing"] = ["trainer_r2"]
        if i % 3 == 0:
            z = [[rng.random(), None], [rng.random(), rng.random()]]
            event["heat"] = {"rows": ["trainer_r0", "trainer_r1"], "phases": ["backward", "forward"], "z": z, "band": 1}
        yield event
        if i % 11 == 0:
            yield {"kind": "step", "step": step - 2, "values": {"loss": rng.random(), "g/3": 1.5}, "late": True}
        if i % 3 == 0:
            yield {"kind": "anomaly", "type": "straggler", "step": step, "process": f"trainer_r{i % 4}"}
        if i % 4 == 0:
            row = {"row": {"prompt": "p" * (i % 700), "score": rng.random()}, "process": "trainer_r0"}
            yield {"kind": "samples", "table": f"t{i % 20}", "step": step, "rows": [row], "late": None}
        if i % 250 == 0:
            bars = [{"p": "trainer_r0", "r": 0, "o": "trainer", "n": "step", "s": 0, "d": rng.random(), "i": "a"}]
            yield {"kind": "gantt", "why": f"asked {i % 3}", "step": step, "ms": 1.0, "spans": bars, "more": 0}
            yield {"kind": "status", "points": i, "processes": 4, "note": "x"}
            yield {"kind": "runs", "runs": [{"run": "run-0", "started": 1.0, "href": "../run-0/report.html"}]}
        if i % 600 == 0:
            yield None  # a line cut by a crash
        step += 1


def test_a_snapshot_taken_at_any_event_restores_the_summary_exactly() -> None:
    """Compaction can come after any event, and a reopened summary compacts again: restore
    from the last restored summary's snapshot at many events, keep adding, same page as never."""
    rng = random.Random(5)
    whole, restored = Summary(), Summary()
    restores = 0
    for i, event in enumerate(summary_events(1_600, seed=3)):
        whole.add(event)
        restored.add(event)
        if rng.random() < 0.006:
            restores += 1
            snapshot = json.dumps(restored.snapshot(), separators=(",", ":"))
            restored = Summary()
            restored.add(json.loads(snapshot))
            assert restored.data() == whole.data(), i
    data = whole.data()
    assert restores > 15 and data["stride"] == 2 and data["series_not_shown"] == 0 and len(data["rewinds"]) == 2
    assert len(data["anomalies"]) == 500 and data["heat"] and data["late"] and data["missing"] and data["gantt"]
    assert page_data(restored) == page_data(whole) and restored.skipped_events == whole.skipped_events == 3


def test_the_data_file_stays_bounded_however_long_the_run(tmp_path: Path) -> None:
    view = ReportBackend({"path": str(tmp_path / "report.html"), "compact_bytes": 64 << 10})
    view.init("trainer_r0", experiment="exp")
    keys = TRAINER_KEYS[:2]
    metrics_of = {p: [Metric(k, 0.0, Reduce.MEAN) for k in keys] for p in TRAINERS}
    sizes, snapshots = [], []
    for step in range(5_000):
        per = {p: [Metric(m.key, step + p.rank / 4, Reduce.MEAN) for m in ms] for p, ms in metrics_of.items()}
        view.log_batch([Metric(k, float(step), Reduce.MEAN) for k in keys], step, per_process=per)
        sizes.append(view.data_path.stat().st_size)
        if step and sizes[-1] < sizes[-2]:  # compacted: the file is the snapshot
            snapshots.append(sizes[-1])
        if step == 999:  # 2 series of MAX_POINTS points each: the summary is as large as it gets
            full = len(json.dumps(view.summary.snapshot(), separators=(",", ":")))
    view.finish()
    assert len(snapshots) > 5 and max(snapshots) < 1.2 * full  # bounded, as the summary is
    # the file: the last snapshot, then at most max(compact_bytes, 2 × that snapshot) appended
    assert max(sizes[1_000:]) < 3.6 * full + (64 << 10)
    assert read(view.data_path).last_step == 4_999 and sizes[-1] < 3 * sizes[999]


def test_a_reopened_view_goes_on_from_its_compacted_file(tmp_path: Path) -> None:
    """Reopening (an idle experiment's views closed, the sink restarted) compacts the file at
    once and goes on: same page as the uncompacted events of both openings."""
    path, plain_path = tmp_path / "a" / "report.html", tmp_path / "b" / "report.html"
    run = list(calls(300, seed=11, rewinds={250: 200}, report_at=100))
    views = backend(path, compact_bytes=0), backend(plain_path, compact_bytes=NEVER)
    for call in run[: len(run) // 2]:
        for view in views:
            call(view)
    for view in views:
        view.finish()
    before = views[1].data_path.read_bytes()  # every event of the first opening
    views = backend(path, compact_bytes=0), backend(plain_path, compact_bytes=NEVER)
    lines = views[0].data_path.read_bytes().splitlines()  # compacted on reopening: one snapshot
    assert json.loads(lines[0])["kind"] == "snapshot" and len(lines) <= 2  # (and "experiment", once flushed)
    for call in run[len(run) // 2 :]:
        for view in views:
            call(view)
    for view in views:
        view.finish()
    reference = Summary()
    for line in before.splitlines() + views[1].data_path.read_bytes().splitlines()[1:]:  # [0]: its snapshot
        reference.add(json.loads(line))
    assert reference.last_step == 249 and reference.rewinds == [{"step": 200, "from": 249}]
    assert page_data(read(path.with_suffix(".jsonl"))) == page_data(reference) == page_data(views[0].summary)


def test_a_crash_leaves_a_file_that_reads_and_reopens(tmp_path: Path) -> None:
    """A crash mid-append cuts the last line: it is skipped, and the view reopened on the file
    appends after it whole. A crash mid-compaction leaves the temporary file beside the old
    one: the old one is read; the next compaction writes over the temporary file."""
    path = tmp_path / "report.html"
    view = backend(path, compact_bytes=0)
    run = list(calls(120, seed=2, report_at=50))
    for call in run[:300]:
        call(view)
    view.finish()
    data = path.with_suffix(".jsonl")
    expected = page_data(read(data))
    tmp = data.with_name(".report.jsonl.tmp")
    tmp.write_text('{"kind":"snapshot","version":1,"experiment":"ex')  # cut mid-compaction
    with data.open("a") as f:
        f.write('{"kind": "step", "step": 10000, "val')  # cut mid-append
    cut = read(data)
    assert cut.skipped_events == 1 and page_data(cut) == expected.replace('"skipped_events":0', '"skipped_events":1')
    view = backend(path, compact_bytes=0)
    for call in run[300:]:
        call(view)
    view.finish()
    found = read(data)
    assert found.skipped_events == 1 and found.last_step == view.summary.last_step == 119
    assert page_data(found) == page_data(view.summary)
    assert not tmp.exists() and [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_a_malformed_snapshot_is_skipped_and_changes_nothing() -> None:
    summary = Summary()
    summary.add({"kind": "experiment", "id": "exp", "run": ""})
    summary.add({"kind": "step", "step": 1, "values": {"loss": 1.0}})
    good = summary.snapshot()
    expected = page_data(summary)
    bad = [
        {**good, "version": 2},  # a newer rankscope's
        {**good, "globals": "x"},
        {**good, "globals": [["loss", [[[1, 1.0, None, None]], [[None, None]], None, None, 1, 1]]]},
        {**good, "heat_stride": 0},
        {**good, "missing": [{"step": 1}]},
        {key: value for key, value in good.items() if key != "status"},
    ]
    for event in bad:
        summary.add(json.loads(json.dumps(event)))
    assert summary.skipped_events == len(bad)
    assert page_data(summary) == expected.replace('"skipped_events":0', f'"skipped_events":{len(bad)}')
