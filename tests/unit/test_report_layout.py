"""What a report page shows first and how runs are compared, as data (``report.series``,
``report.summary``, ``report.compare``); how it looks on screen is ``tests/e2e/test_report*.py``.

The user's keys in the order they first came, whatever order later steps list them in and
across a snapshot; traced phases' seconds only as Phases charts; rankscope's own keys apart; a
constant series flagged; a run's start and configuration kept; runs found on disk linked; the
comparison's runs, differing configuration and one entry per key with a line per run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rankscope.backends.base import Metric
from rankscope.backends.report import ReportBackend
from rankscope.metrics.reduce import Reduce
from rankscope.report import compare, page
from rankscope.report.series import kind_of
from rankscope.report.summary import Summary, config_of, read
from rankscope.sink.checked import Process


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
    assert kind_of("straggler/train/max_over_median") == "internal"
    assert kind_of("trainer/loss") == kind_of("comm/all_reduce/duration_s") == "metric"
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
            "straggler/train/fwd/max_over_median": 1.0 + n,
            "straggler/train/fwd/slowest_rank": 1.0,
        }
        summary.add(step(n, values))
    data = summary.data()
    assert [k["key"] for k in data["roles"][0]["keys"]] == ["loss"] and data["globals"] == []
    (chart,) = data["phase_charts"]
    assert chart["role"] == "trainer" and chart["block"] == "train"
    assert [line["phase"] for line in chart["lines"]] == ["fwd", "bwd", "total"]  # as they came, the total last
    assert chart["lines"][0]["points"] == [[0, 0.0, 0.0], [1, 0.1, 0.2], [2, 0.2, 0.4]]  # [step, mean, max]
    internals = [(k["role"], k["key"], k["constant"]) for k in data["internals"]]
    assert internals == [
        ("", "rankscope/missing_processes", True),
        ("", "straggler/train/fwd/max_over_median", False),
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
