"""What a report page shows first and how runs are compared, as data (``report.series``,
``report.summary``, ``report.health``, ``report.compare``, and the Perfetto file's
``report.perfetto``); how it looks on screen is ``tests/e2e/test_report*.py``.

The user's keys in the order they first came, whatever order later steps list them in and
across a snapshot; traced phases' seconds only as Phases charts; rankscope's own keys apart; a
constant series flagged; each straggler streak once, with its cause and its victims' wait; the
last arrival at a collective marked in the Gantts; a run's start and configuration kept; runs
found on disk linked; the comparison's runs, differing configuration and one entry per key with
a line per run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

from rankscope.backends.base import Metric
from rankscope.backends.report import ReportBackend
from rankscope.metrics.reduce import Reduce
from rankscope.report import compare, page, perfetto
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
