"""What a report page shows first and how runs are compared, as data (``report.series``,
``report.summary``, ``report.health``, ``report.compare``, and the Perfetto file's
``report.perfetto``); how it looks on screen is ``tests/e2e/test_report*.py``.

The user's keys in the order they first came, whatever order later steps list them in and
across a snapshot; traced phases' seconds only as Phases charts; rankscope's own keys apart; a
constant series flagged; each straggler streak once, with its cause and its victims' wait; the
last arrival at a collective marked in the Gantts; a run's start and configuration kept; runs
found on disk linked; the comparison's runs, differing configuration and one entry per key with
a line per run. A step chosen for several reasons is one Gantt, on the step's own time range
where spans around it would squeeze it; a late update says whether it was merged into its step;
a run's start is its ranks' first data; ``rankscope report`` refuses the Gantt options it would
otherwise ignore.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

from rankscope.backends.base import Metric
from rankscope.backends.report import ReportBackend
from rankscope.core.anomalies import Corrected, Interrupted, Partial
from rankscope.metrics.reduce import Reduce
from rankscope.report import compare, page, perfetto
from rankscope.report.phases import focus_of
from rankscope.report.series import kind_of
from rankscope.report.summary import Summary, config_of, gantt_spans, read
from rankscope.sink.testing import Process


def cell(value: float, processes: int = 2) -> list[Any]:
    return [value, "a", value, "b", value, processes]


def step(n: int, keys: dict[str, float], role: str = "trainer", processes: int = 2) -> dict[str, Any]:
    return {
        "kind": "step",
        "step": n,
        "values": dict(keys),
        "spread": {role: {k: cell(v, processes) for k, v in keys.items() if not k.startswith("rankscope/")}},
    }


def test_keys_come_in_the_order_first_recorded_whatever_later_steps_say() -> None:
    summary = Summary()
    summary.add(step(0, {"zeta/loss": 1.0, "alpha/acc": 0.5, "rl/lineage_links_dropped": 0.0}))
    summary.add(step(1, {"mid/lr": 0.1, "alpha/acc": 0.6, "zeta/loss": 0.9, "rl/lineage_links_dropped": 0.0}))
    summary.add(step(2, {"alpha/acc": 0.7, "mid/lr": 0.1, "zeta/loss": 0.8}))
    keys = [k["key"] for k in summary.data()["roles"][0]["keys"]]
    assert keys == ["zeta/loss", "alpha/acc", "mid/lr"]  # not sorted: as they came, rl/* apart
    again = Summary()
    again.add(json.loads(json.dumps(summary.snapshot())))
    assert again.data() == summary.data()  # a compacted file keeps the order


def test_roles_with_more_processes_come_first() -> None:
    summary = Summary()
    summary.add({"kind": "step", "step": 0, "values": {"a": 1.0, "b": 2.0}, "spread": {"alpha": {"a": cell(1.0, 1)}}})
    summary.add({"kind": "step", "step": 0, "values": {"b": 2.0}, "spread": {"zulu": {"b": cell(2.0, 8)}}})
    assert [r["role"] for r in summary.data()["roles"]] == ["zulu", "alpha"]


def test_phase_seconds_go_to_phases_and_rankscopes_keys_to_internals() -> None:
    assert kind_of("train/forward/duration_avg_s") == kind_of("train/total_duration_max_s") == "duration"
    assert kind_of("rl/lineage_links_dropped") == kind_of("rankscope/missing_processes") == "internal"
    assert kind_of("straggler/train/over_others") == kind_of("straggler/comm/all_reduce/late_s") == "internal"
    assert kind_of("trainer/loss") == "metric"
    assert kind_of("comm/all_reduce/duration_s") == kind_of("optimizer/lr/group_0") == "internal"  # instrumentors
    summary = Summary()
    for n in range(3):
        values = {
            "loss": 1.0 / (n + 1),
            "train/fwd/duration_avg_s": 0.1 * n,
            "train/fwd/duration_max_s": 0.2 * n,
            "train/bwd/duration_avg_s": 0.3,
            "train/bwd/duration_max_s": 0.4,
            "train/total_duration_avg_s": 0.5,
            "train/total_duration_max_s": 0.6,
            "rankscope/missing_processes": 0.0,
            "straggler/train/fwd/over_others": 1.0 + n,
            "straggler/train/fwd/late_rank": 1.0,
            "straggler/train/fwd/late_s": 0.1 * n,
            "straggler/comm/all_reduce/late_rank": 1.0,
            "straggler/comm/all_reduce/waited_s_max": 0.1 * n,
        }
        summary.add(step(n, values))
    data = summary.data()
    assert [k["key"] for k in data["roles"][0]["keys"]] == ["loss"] and data["globals"] == []
    (chart,) = data["phase_charts"]
    assert chart["role"] == "trainer" and chart["block"] == "train"
    assert [line["phase"] for line in chart["lines"]] == ["fwd", "bwd", "total"]  # as they came, the total last
    assert chart["lines"][0]["points"] == [[0, 0.0, 0.0], [1, 0.1, 0.2], [2, 0.2, 0.4]]  # [step, mean, max]
    internals = [(k["role"], k["key"], k["constant"]) for k in data["internals"]]
    assert internals == [  # the ratios and seconds, not the ranks
        ("", "rankscope/missing_processes", True),
        ("", "straggler/train/fwd/over_others", False),
        ("", "straggler/train/fwd/late_s", False),
        ("", "straggler/comm/all_reduce/waited_s_max", False),
    ]


def straggler(first: int, who: str = "trainer_r2", named: int = 1, **more: Any) -> dict[str, Any]:
    """A sink's straggler record as the sink named it, ``named`` steps after its streak began
    (``kind``: a line of report.jsonl)."""
    record = {"kind": "anomaly", "type": "straggler", "step": first, "first_step": first, "last_step": first + named}
    record |= {"steps": named + 1, "process": who, "role": "trainer", "replica": None, "rank": int(who[-1])}
    record |= {"phase": "train/forward", "collective": "all_reduce", "ratio": 352.6, "excess_s": 0.1501}
    return {**record, "late_s": 0.1498, "waited_s_max": 0.15, "waiting": 3, **more}


def test_each_straggler_streak_is_one_entry_with_its_cause_and_victims_however_it_came() -> None:
    """The sink's record comes when it names the streak; its later state (a copy, or the status's
    records: its latest step's phase and figures) lengthens that streak and adds none; a sink
    that said each step is folded into streaks."""
    summary = Summary()
    summary.add(straggler(3))
    summary.add(straggler(5, "trainer_r0", named=0, collective=None, waited_s_max=None, waiting=0))
    summary.add(straggler(3, named=6, phase="train/backward", excess_s=0.2))  # the streak as it went on
    status = {"kind": "status", "points": 9, "anomalies": [straggler(5, "trainer_r0", collective=None)]}
    summary.add(status)
    summary.add({"kind": "status", "points": 10, "anomalies": [straggler(3, named=5)]})  # an older state
    for step in (20, 21, 22, 30):  # an older sink's records, one a step
        summary.add({"kind": "anomaly", "type": "straggler", "step": step, "process": "trainer_r1", "phase": "bwd"})
    again = Summary()
    again.add(json.loads(json.dumps(summary.snapshot())))
    data = summary.data()
    assert again.data() == data and data["anomaly_counts"] == {"straggler": 6}  # 2 streaks, 4 old records
    streaks = [(s["process"], s["phase"], s["first"], s["last"], s["steps"]) for s in data["stragglers"]]
    assert streaks == [
        ("trainer_r2", "train/backward", 3, 9, 7),
        ("trainer_r1", "bwd", 20, 22, 3),
        ("trainer_r0", "train/forward", 5, 6, 2),
        ("trainer_r1", "bwd", 30, 30, 1),
    ]  # the longest first
    first = data["stragglers"][0]
    assert (first["excess_s"], first["ratio"], first["collective"], first["waited_s_max"], first["waiting"]) == (
        0.2,
        352.6,
        "all_reduce",
        0.15,
        3,
    )
    assert data["stragglers"][1]["excess_s"] is None and data["stragglers"][2]["collective"] is None
    assert [a["type"] for a in data["anomalies"]].count("straggler") == 6


def test_the_last_arrival_at_a_collective_is_marked_in_the_perfetto_file_and_the_pages_gantt(tmp_path: Path) -> None:
    """The sink set ``rankscope.comm.wait_s`` on each rank's all-reduce and ``arrived_last`` on the
    rank the others waited for: Perfetto shows the wait as an arg and an instant on that rank's
    track at its start; the page's Gantt bars keep both."""
    rows = []
    for rank, (start, wait) in enumerate([(0, 150_000_000), (150_000_000, 0.0), (10_000_000, 140_000_000)]):
        attributes: dict[str, Any] = {"rankscope.comm.op": "all_reduce", "rankscope.comm.wait_s": wait / 1e9}
        if rank == 1:
            attributes["rankscope.comm.arrived_last"] = True
        row = {"name": "comm/all_reduce", "span_id": f"s{rank}", "start_ns": 10**12 + start, "rank": rank}
        rows.append(row | {"end_ns": 10**12 + 151_000_000, "role": "trainer", "process": f"trainer_r{rank}", "step": 4})
        rows[-1]["attributes"] = attributes
    out = tmp_path / "trace.json"
    perfetto.write(rows, out)
    events = json.loads(out.read_text())["traceEvents"]
    pids = {e["args"]["name"]: e["pid"] for e in events if e["name"] == "process_name"}
    (mark,) = [e for e in events if e["name"].startswith("last arrival")]
    assert mark["name"] == "last arrival: trainer_r1" and mark["ph"] == "i" and mark["pid"] == pids["trainer_r1"]
    assert mark["ts"] == (10**12 + 150_000_000) / 1e3 and mark["args"]["op"] == "all_reduce"
    waits = {e["pid"]: e["args"]["rankscope.comm.wait_s"] for e in events if e["name"] == "comm/all_reduce"}
    assert waits == {pids["trainer_r0"]: 0.15, pids["trainer_r1"]: 0.0, pids["trainer_r2"]: 0.14}

    bars, _ = gantt_spans(rows)
    assert [(b["p"], b.get("w"), b.get("a")) for b in bars] == [
        ("trainer_r0", 150.0, None),
        ("trainer_r1", 0.0, True),
        ("trainer_r2", 140.0, None),
    ]
    summary = Summary()
    summary.add({"kind": "gantt", "why": "first straggler", "step": 4, "ms": 151.0, "spans": bars})
    assert [(b.get("w"), b.get("a")) for b in summary.data()["gantt"][0]["spans"]] == [
        (150.0, None),
        (0.0, True),
        (140.0, None),
    ]


def test_a_series_that_never_changed_is_flagged_constant() -> None:
    summary = Summary()
    for n in range(4):
        summary.add(step(n, {"samples": 1024.0, "loss": 1.0 + (n == 2)}))
    keys = {k["key"]: k["constant"] for k in summary.data()["roles"][0]["keys"]}
    assert keys == {"samples": True, "loss": False}


def process(role: str, rank: int, **attributes: Any) -> Process:
    resource = {
        "rankscope.experiment.id": "exp",
        "rankscope.run.id": "r1",
        "rankscope.role": role,
        "rankscope.rank": str(rank),
        "rankscope.world_size": "2",
        "rankscope.mesh.dp.rank": str(rank),
        "rankscope.mesh.dp.size": "2",
        "service.instance.id": f"id{rank}",
        "host.name": f"node{rank}",
        "process.pid": 100 + rank,
        **attributes,
    }
    return Process(f"{role}-{rank}", f"{role}_r{rank}", role, None, rank, 2, 0, "host", 100 + rank, resource)


def test_a_runs_configuration_is_what_its_processes_resources_say() -> None:
    found = config_of([("trainer", process("trainer", 0, lr="0.1").resource)])
    assert found == {
        "trainer": {"rankscope.world_size": "2", "rankscope.mesh.dp.size": "2", "lr": "0.1"}
    }  # not who each process is: ids, ranks, hosts, pids
    summary = Summary()
    summary.add({**step(0, {"loss": 1.0}), "config": found})
    other = config_of([("trainer", process("trainer", 1, lr="0.2").resource)])
    summary.add({**step(1, {"loss": 1.0}), "config": other})
    assert summary.config["trainer"]["lr"] is None  # two processes of a role disagree
    again = Summary()
    again.add(json.loads(json.dumps(summary.snapshot())))
    assert again.config == summary.config


def run_dir(root: Path, run: str, loss: list[float], lr: str, started: float) -> Path:
    """A run's directory as the report view writes it, from real view calls."""
    view = ReportBackend({"path": str(root / "{experiment}" / "{run}" / "report.html")})
    view.init("global", experiment="exp", run=run)
    trainers = [process("trainer", rank, lr=lr, seed="7") for rank in range(2)]
    for n, value in enumerate(loss):
        per = {p: [Metric("loss", value, Reduce.MEAN), Metric("tokens", 512.0, Reduce.SUM)] for p in trainers}
        metrics = [Metric("loss", value, Reduce.MEAN, started + n), Metric("tokens", 1024.0, Reduce.SUM, started + n)]
        view.log_batch(metrics, n, per_process=per)
    view.report({"runs": [{"run": run, "started": started, "attempt": 1}]})
    view.finish()
    return view.path.parent


def test_the_comparison_lists_runs_with_what_differs_and_a_line_per_run(tmp_path: Path) -> None:
    first = run_dir(tmp_path, "run-a", [3.0, 2.0, 1.0], "0.1", started=1_000.0)
    second = run_dir(tmp_path, "run-b", [3.5, 2.5], "0.2", started=2_000.0)
    assert page.run_dirs(tmp_path / "exp") == [first, second]
    out = tmp_path / "exp" / "compare.html"
    data = compare.comparison([(second, read(second / "report.jsonl")), (first, read(first / "report.jsonl"))], out)
    assert [r["run"] for r in data["runs"]] == ["run-a", "run-b"]  # oldest first
    a, b = data["runs"]
    assert (a["steps"], a["first_step"], a["last_step"], a["attempts"], a["status"]) == (3, 0, 2, 2, "ok")
    assert a["href"] == "run-a/report.html" and a["label"].endswith(" · run-a")
    assert data["config_keys"] == ["lr"] and (a["config"], b["config"]) == ({"lr": "0.1"}, {"lr": "0.2"})
    assert [(k["key"], k["kind"], k["constant"]) for k in data["keys"]] == [
        ("loss", "metric", False),
        ("tokens", "metric", True),
    ]
    loss = data["keys"][0]
    assert loss["lines"] == [
        {"run": 0, "points": [[0, 3.0], [1, 2.0], [2, 1.0]]},
        {"run": 1, "points": [[0, 3.5], [1, 2.5]]},
    ]
    html = compare.render([(first, read(first / "report.jsonl"))], out)
    assert "compare.js" not in html and "window.rankscope" in html  # the scripts inlined


def test_a_runs_page_links_the_runs_found_beside_it(tmp_path: Path) -> None:
    """Each launch had its own sink: a page written once both exist lists the other, found on disk."""
    first = run_dir(tmp_path, "run-a", [1.0], "0.1", started=1_000.0)
    second = run_dir(tmp_path, "run-b", [1.0], "0.1", started=2_000.0)

    def listed(directory: Path) -> list[tuple[str, str | None]]:
        html = page.render(read(directory / "report.jsonl"), directory / "report.html")
        data = json.loads(html.split('id="rankscope-data">', 1)[1].split("</script>", 1)[0])
        return [(r["run"], r.get("href")) for r in data["runs"]]

    assert listed(second) == [("run-b", None), ("run-a", "../run-a/report.html")]
    assert listed(first) == [("run-a", None), ("run-b", "../run-b/report.html")]
    flat = tmp_path / "flat" / "report.html"  # a page not in a run's directory: nothing beside it is a run
    assert page.siblings(flat, "run-c", []) == []


def test_every_link_a_page_writes_is_a_relative_path_no_part_of_which_reads_as_a_scheme(tmp_path: Path) -> None:
    """A run's directory named like a script link (a client's run id, or a posted path) is linked
    with each part quoted; a link from a report's events that is not a relative path is dropped."""
    from rankscope.report.values import relative_link

    first = run_dir(tmp_path, "run-a", [1.0], "0.1", started=1_000.0)
    odd = run_dir(tmp_path, "javascript:alert(1)", [1.0], "0.1", started=2_000.0)
    html = page.render(read(first / "report.jsonl"), first / "report.html")
    data = json.loads(html.split('id="rankscope-data">', 1)[1].split("</script>", 1)[0])
    links = [r.get("href") for r in data["runs"] if r.get("href")]
    assert links == ["../" + quote(odd.name, safe="") + "/report.html"] and ":" not in links[0]
    assert relative_link("../run-b/report.html") == "../run-b/report.html"
    assert relative_link("javascript:alert(1)") == "javascript%3Aalert%281%29"
    for hostile in ("/etc/passwd", "//evil.example/x", "\\\\host\\x", "a//b", "", None, 7, "x" * 501):
        assert relative_link(hostile) is None, hostile


# -- the Gantts: one per step, on the step's own time range ------------------------------------------


def bar(process: str, role: str, name: str, start: float, end: float, parent: str = "") -> dict[str, Any]:
    """A Gantt bar as ``gantt_spans`` makes it (ms)."""
    return {
        "p": process,
        "r": 0,
        "o": role,
        "n": name,
        "s": start,
        "d": end - start,
        "i": f"{process}/{name}",
        "u": parent,
    }


def test_a_step_chosen_for_several_reasons_is_one_gantt_naming_them_all() -> None:
    summary = Summary()
    spans = [bar("trainer_r0", "trainer", "step", 0.0, 10.0)]
    for why, step_ in (("last step", 5), ("step 3", 3), ("slowest step", 3), ("first straggler", 3)):
        summary.add({"kind": "gantt", "why": why, "step": step_, "ms": 10.0, "spans": spans})
    gantts = summary.data()["gantt"]
    assert [(g["step"], g["why"], g["whys"]) for g in gantts] == [
        (3, "first straggler, slowest step and step 3", ["first straggler", "slowest step", "step 3"]),
        (5, "last step", ["last step"]),
    ]  # the page's order: the first straggler, the slowest, the last, then those asked for
    again = Summary()
    again.add(json.loads(json.dumps(summary.snapshot())))
    assert again.data()["gantt"] == gantts


def test_a_gantts_axis_is_the_steps_own_range_where_spans_around_it_would_squeeze_it() -> None:
    rollout = bar("generator_r0", "generator", "generate", 0.0, 3300.0)  # 3.5 s before the trainer's step
    trainer = [
        bar("trainer_r0", "trainer", "step", 3500.0, 4500.0),
        bar("trainer_r1", "trainer", "train/forward", 3510.0, 4400.0, "root"),
    ]
    assert focus_of([rollout, *trainer]) == {"from": 3500.0, "to": 4500.0, "role": "trainer", "before": 1, "after": 0}
    following = bar("generator_r0", "generator", "generate", 4000.0, 9000.0)  # the next rollout, on after the step
    assert focus_of([*trainer, following]) == {"from": 3500.0, "to": 4500.0, "role": "trainer", "before": 0, "after": 1}
    assert focus_of([bar("generator_r0", "generator", "generate", 3300.0, 3450.0), *trainer]) is None  # it fits
    assert focus_of(trainer) is None
    learner = [
        bar("learner_0", "learner", "step", 3500.0, 4500.0),
        bar("learner_0", "learner", "update", 3600.0, 4400.0, "x"),
    ]
    assert focus_of([rollout, *learner])["role"] == "learner"  # no trainer: the role holding the step's root span
    assert (
        focus_of([rollout, bar("worker_0", "worker", "work", 3500.0, 4500.0)]) is None
    )  # nothing says whose step it is


# -- late updates: merged into their step, or not ---------------------------------------------------


def test_a_late_update_says_whether_it_was_merged_into_its_step() -> None:
    """What the report view writes of a late update: the sink's record (``corrected``: merged into
    the step, whose values are its exact total again; ``partial``: past the window, not merged),
    then the step's late values. Only the unmerged ones are a run's trouble."""
    summary = Summary()
    for n in range(4):
        summary.add(step(n, {"loss": 1.0}))
    summary.add({"kind": "anomaly", **Corrected(step=1, processes=("trainer_r1",), count=1).to_json()})
    summary.add({**step(1, {"loss": 0.5}), "late": True})
    assert compare._status(summary) == "ok"  # merged: the step is exact again, nothing went wrong
    partial = Partial(step=2, processes=("trainer_r0", "trainer_r1"), count=2, points=4)
    summary.add({"kind": "anomaly", **partial.to_json()})
    summary.add({"kind": "step", "step": 2, "values": {}, "late": True})
    data = summary.data()
    assert data["late"] == [
        {"step": 1, "updates": 1, "processes": ["trainer_r1"], "merged": True},
        {"step": 2, "updates": 1, "processes": ["trainer_r0", "trainer_r1"], "merged": False},
    ]
    assert (data["late_updates"], data["late_unmerged"]) == (2, 1)
    assert data["roles"][0]["keys"][0]["points"][1][1] == 0.5  # the merged value replaced the step's
    again = Summary()
    again.add(json.loads(json.dumps(summary.snapshot())))
    assert again.data() == data
    assert compare._status(summary) == "1 late update not merged (its step's values lack it)"


def test_a_run_that_failed_or_was_interrupted_is_not_ok() -> None:
    """``rankscope report <experiment>/``'s table: the step a job ended in says how it ended."""
    for record, said in (
        (Interrupted(step=3, processes=("trainer_r0",), count=1), "interrupted (step 3)"),
        (
            Interrupted(step=9, processes=("trainer_r0",), count=1, failed=("trainer_r1",), errors=("E: x",)),
            "failed: trainer_r1 raised (step 9)",
        ),
    ):
        summary = Summary()
        summary.add(step(0, {"loss": 1.0}))
        summary.add({"kind": "anomaly", **record.to_json()})
        assert compare._status(summary) == said


# -- rankscope report: what it would ignore, it refuses ----------------------------------------------


def test_report_refuses_gantt_options_for_an_experiments_directory(tmp_path: Path, capsys: Any) -> None:
    """``--spans``/``--steps`` add a Gantt to one run's page; the comparison of an experiment's runs
    draws none: refused (exit 2), saying where they apply, and nothing written."""
    from rankscope.cli import main as cli

    run = run_dir(tmp_path, "run-a", [3.0, 2.0], "0.1", started=1_000.0)
    run_dir(tmp_path, "run-b", [3.5], "0.2", started=2_000.0)
    spans = tmp_path / "spans.jsonl"
    row = {"name": "train", "start_ns": 10**12, "end_ns": 10**12 + 5 * 10**6, "step": 1, "process": "trainer_r0"}
    spans.write_text(json.dumps(row | {"role": "trainer", "rank": 0, "span_id": "a"}) + "\n")
    experiment = tmp_path / "exp"
    for flags in (["--spans", str(spans), "--steps", "1"], ["--spans", str(spans)], ["--steps", "1"]):
        assert cli(["report", str(experiment), *flags]) == 2, flags
        said = capsys.readouterr().err
        assert "--spans" in said and ("to one run's page" in said or "give --spans" in said), said
        assert flags == ["--steps", "1"] or f"{experiment} is an experiment's directory" in said, said
    assert not (experiment / "compare.html").exists()
    assert cli(["report", "--sink", "http://127.0.0.1:9", "--spans", str(spans)]) == 2  # nor to a sink's page
    assert "not to a sink's page" in capsys.readouterr().err
    assert cli(["report", str(run), "--spans", str(spans), "--steps", "1"]) == 0  # one run's page: they apply
    assert [g["step"] for g in read(run / "report.jsonl").data()["gantt"]] == []  # the file is the view's own
    html = (run / "report.html").read_text()
    assert '"why":"step 1"' in html
    assert cli(["report", str(experiment)]) == 0 and (experiment / "compare.html").is_file()


# -- when a run started ------------------------------------------------------------------------------


def test_a_runs_start_is_its_ranks_first_data_not_the_sinks_first_word_of_the_launch(tmp_path: Path) -> None:
    """The sink's record of the run says when it first heard of the run from any process carrying
    its id: 150 s before the ranks' first step here (a process of the launch command reported
    first). The comparison and the run's title say the ranks' first data; the sink's record only
    for a run with no step yet."""
    view = ReportBackend({"path": str(tmp_path / "{experiment}" / "{run}" / "report.html")})
    view.init("global", experiment="exp", run="launch")
    for n in range(3):
        view.log_batch([Metric("loss", 1.0 / (n + 1), Reduce.MEAN, 1_000.0 + 10 * n)], n)
    view.report({"runs": [{"run": "launch", "started": 850.0, "attempt": 0}]})
    view.finish()
    found = read(view.path.with_name("report.jsonl"))
    assert found.started_at() == 1_000.0
    (row,) = compare.comparison([(view.path.parent, found)], tmp_path / "exp" / "compare.html")["runs"]
    assert row["started"] == page.when(1_000.0, precise=True) and row["label"].startswith(row["started"])
    assert page.title_of(found) == f"exp · {page.when(1_000.0)}"
    waiting = Summary()  # no step finalized yet: the sink's record is all there is
    waiting.add({"kind": "experiment", "id": "exp", "run": "launch"})
    waiting.add({"kind": "runs", "runs": [{"run": "launch", "started": 850.0, "attempt": 0}]})
    assert waiting.started_at() == 850.0


def test_a_key_the_lowest_rank_lacks_in_the_first_step_keeps_its_place() -> None:
    """The spread lists a role's keys in its first process's order: a phase that process did not
    report in the run's first step (its seconds went out with a periodic export) would come after
    the others'. The page follows the global values' order (the sink's) instead."""
    values = {
        "train/data/duration_avg_s": 0.1,
        "train/forward/duration_avg_s": 0.2,
        "train/backward/duration_avg_s": 0.3,
        "train/total_duration_avg_s": 0.6,
    }
    first = {"trainer": {k: cell(v) for k, v in reversed(values.items())}}  # r0 had backward and total only
    summary = Summary()
    summary.add({"kind": "step", "step": 0, "values": values, "spread": first})
    summary.add(step(1, values))
    (chart,) = summary.data()["phase_charts"]
    assert [line["phase"] for line in chart["lines"]] == ["data", "forward", "backward", "total"]


def test_a_step_viewed_without_its_spread_joins_its_keys_role_charts() -> None:
    """A run's first step after time buckets (``sink.book.buckets``) may come without a spread:
    its values join the role's charts of the same keys, not charts of their own."""
    values = {"loss": 2.0, "train/fwd/duration_avg_s": 0.5, "train/total_duration_avg_s": 0.6}
    summary = Summary()
    summary.add({"kind": "step", "step": 0, "values": values})
    summary.add(step(1, {k: v / 2 for k, v in values.items()}))
    data = summary.data()
    assert data["globals"] == []
    (loss,) = data["roles"][0]["keys"]
    assert [p[:2] for p in loss["points"]] == [[0, 2.0], [1, 1.0]]
    (chart,) = data["phase_charts"]
    assert chart["role"] == "trainer" and [line["phase"] for line in chart["lines"]] == ["fwd", "total"]
    assert chart["lines"][0]["points"] == [[0, 0.5, None], [1, 0.25, None]]


def test_a_step_without_its_spread_costs_no_chart_of_the_series_limit() -> None:
    """300 keys whose first step came without a spread, then with one: 300 charts, each with its
    first point, none left out (a global-only series a role's joins is no chart of its own)."""
    values = {f"k{i:03d}": float(i) for i in range(300)}
    summary = Summary()
    summary.add({"kind": "step", "step": 0, "values": values})
    for n in range(1, 4):
        summary.add(step(n, values))
    data = summary.data()
    keys = data["roles"][0]["keys"]
    assert data["series_not_shown"] == 0 and data["globals"] == [] and len(keys) == 300
    assert all(k["points"][0][0] == 0 for k in keys)


def test_a_phase_whose_first_step_came_without_its_spread_keeps_its_place() -> None:
    """A run's first step after time buckets (a periodic export before the first flush carried the
    data phase's seconds): that step's ``data`` is global only, its spread comes from step 1 on.
    It charted after ``backward`` (CI: forward, backward, data); it keeps its first place, across a
    snapshot too."""
    values = {
        "train/data/duration_avg_s": 0.1,
        "train/forward/duration_avg_s": 0.2,
        "train/backward/duration_avg_s": 0.3,
        "train/total_duration_avg_s": 0.6,
    }
    spread_without_data = {"trainer": {k: cell(v) for k, v in values.items() if "/data/" not in k}}
    summary = Summary()
    summary.add({"kind": "step", "step": 0, "values": values, "spread": spread_without_data})
    summary.add(step(1, values))
    again = Summary()
    again.add(json.loads(json.dumps(summary.snapshot())))
    for pages in (summary, again):
        (chart,) = pages.data()["phase_charts"]
        assert [line["phase"] for line in chart["lines"]] == ["data", "forward", "backward", "total"]
        assert [point[0] for point in chart["lines"][0]["points"]] == [0, 1]  # step 0's global value joined in


def test_a_snapshots_order_keeps_only_charted_keys_and_a_full_page_restores() -> None:
    """A snapshot's order naming keys of no series is not carried on (the next snapshot would
    outgrow its bound), and one of a page full of series whose first step came without its spread
    restores: a global-only series a role's joins is no chart of its own, as ``_charts`` counts."""
    from rankscope.report.series import MAX_SERIES

    summary = Summary()
    keys = {f"k{i}": float(i) for i in range(MAX_SERIES - 1)}
    summary.add({"kind": "step", "step": 0, "values": keys, "spread": {}})  # global only
    summary.add(step(1, keys))  # then by role: every key in both tables
    event = json.loads(json.dumps(summary.snapshot()))
    event["order"] = [f"junk{i}" for i in range(2 * MAX_SERIES - len(keys))] + event["order"]
    again = Summary()
    again.add(event)
    assert again.skipped_events == 0
    lines = again.data()["roles"][0]["keys"]
    assert [line["key"] for line in lines] == list(keys) and [p[0] for p in lines[0]["points"]] == [0, 1]
    assert json.dumps(again.snapshot()).count("junk") == 0
